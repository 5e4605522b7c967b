#!/usr/bin/env bash
# Every GPU number of flowgrpo in one pass on one CUDA GPU (H100/H200); results go to files under OUT_DIR:
#   bash benchmarks/gpu_check.sh OUT_DIR
#   1. the CUDA likelihood op's tests and every preset end to end on CUDA      -> gpu_tests.txt
#   2. bench_ops.py --device cuda: the fused op against eager, achieved bandwidth -> bench_ops.txt
#   3. bench_scale.py at real size, random weights of the real architectures:
#      SD3.5-Medium with Flow-GRPO (512 px, group 16, 10 SDE steps, CFG 4.5), SD3.5-Medium with the default
#      (DiffusionNFT), FLUX.1-dev and Wan2.1-1.3B (their configs' resolution and clip)  -> scale_<model>_<preset>.json
#   4. sharding and the memory plan (benchmarks/gpu_scaling_check.sh)           -> scaling/
#   5. with FLOW_GRPO_PATH set to a checkout of yifan123/flow_grpo: bench_peer.py at SD3.5-Medium size, random
#      weights, bf16 (equality of log-probs first, then the equal-work timing)   -> bench_peer.txt
# Each step has its own time limit so that one failing step leaves the others' results. A dry run of step 3 on a
# CPU (one block of each real architecture, small pictures): ONLY=scale EXTRA="model.depth=1 model.dtype=float32
# train.cpu=true model.resolution=32 model.width=32 model.max_sequence_length=16 sampling.plan.num_steps=2" bash ...
set -u
OUT=${1:?give an output folder}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
step() { local limit=$1; shift; echo "== $*"; timeout "$limit" "$@"; echo "== exit $?"; }

run() { [ -z "${ONLY:-}" ] || [ "$ONLY" = "$1" ]; }
run tests && { step 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/likelihood/test_ops.py \
    tests/engine/test_train_presets.py > "$OUT/gpu_tests.txt" 2>&1; tail -n 3 "$OUT/gpu_tests.txt"; }
run ops && { step 60 python3 benchmarks/bench_ops.py --no-compile --device cuda > "$OUT/bench_ops.txt" 2>&1; tail -n 5 "$OUT/bench_ops.txt"; }
scale() {  # model preset [overrides...]
  local model=$1 preset=$2; shift 2
  local args=(); [ "$preset" != default ] && args=(--preset "$preset")
  step 120 python3 benchmarks/bench_scale.py --model "$model" "${args[@]}" --iterations 2 --warmup 1 \
      --output-dir "$OUT/runs" --out "$OUT/scale_${model}_${preset}.json" train.mixed_precision=bf16 "$@" ${EXTRA:-} \
      > "$OUT/scale_${model}_${preset}.txt" 2>&1
  tail -n 1 "$OUT/scale_${model}_${preset}.txt"
}
run scale && scale sd3_5_medium flow_grpo sampling.plan.group_size=16 sampling.plan.num_steps=10 sampling.guidance_scale=4.5 \
    train.prompts_per_iteration=2
run scale && scale sd3_5_medium default train.prompts_per_iteration=2
run scale && scale flux_dev default train.prompts_per_iteration=1
run scale && scale wan2_1_t2v_1_3b default train.prompts_per_iteration=1
run scaling && { step 200 bash benchmarks/gpu_scaling_check.sh "$OUT/scaling" > "$OUT/scaling.txt" 2>&1; tail -n 12 "$OUT/scaling.txt"; }
run peer && [ -n "${FLOW_GRPO_PATH:-}" ] && { step 150 python3 benchmarks/bench_peer.py --flow-grpo "$FLOW_GRPO_PATH" \
    --model sd3_5_medium --random-weights --threads 0 --repeats 2 --prompts 2 --group 16 --steps 10 --micro-batch 16 \
    train.mixed_precision=bf16 ${EXTRA:-} > "$OUT/bench_peer.txt" 2>&1; tail -n 8 "$OUT/bench_peer.txt"; }
