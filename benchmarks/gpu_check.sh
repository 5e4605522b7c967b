#!/usr/bin/env bash
# Every GPU number of flowgrpo in one pass on one CUDA GPU (H100/H200), in about 8 minutes; results go to OUT_DIR:
#   [FLOW_GRPO_PATH=<checkout of yifan123/flow_grpo>] bash benchmarks/gpu_check.sh OUT_DIR
# Steps, most important first, each under its own time limit and all under one deadline (BUDGET seconds, default
# 520), so that a failing or slow step leaves the others' results (OUT_DIR/<step>.txt, scale rows also as .json):
#   ops_tests     the CUDA likelihood op's GPU tests (values, gradients, reproducibility, agreement with the CPU)
#   bench_ops     bench_ops.py --device cuda: the fused op against eager PyTorch, achieved bandwidth
#   scale_*       bench_scale.py at real size, random weights of the real architectures (one warm-up, one measured
#                 iteration): SD3.5-Medium with Flow-GRPO (512 px, group 16, 10 SDE steps, CFG 4.5), FLUX.1-dev
#                 with the default (DiffusionNFT, 512 px, group 8), Wan2.1-1.3B (81 frames at 480x832, group 2),
#                 SD3.5-Medium with the default (group 16)
#   bench_peer    with FLOW_GRPO_PATH: the equal-work comparison with the reference code at SD3.5-Medium size,
#                 bf16 (equality of log-probs first, then the timing)
#   preset_tests  every preset end to end on CUDA (tiny model)
#   scaling       only with ONLY=scaling: sharding and the memory plan (benchmarks/gpu_scaling_check.sh)
# ONLY=<step prefix> runs the matching steps alone. A dry run of the scale rows on a CPU (one block of each real
# architecture, small pictures): ONLY=scale EXTRA="model.depth=1 model.dtype=float32 train.cpu=true
# model.resolution=32 model.width=32 model.max_sequence_length=16 model.num_frames=5 train.mixed_precision=no" bash ...
# Measured on an H200 on 2026-11-27: docs/results/real_size_gpu.md.
set -u
OUT=$(mkdir -p "${1:?give an output folder}" && cd "$1" && pwd)
cd "$(dirname "$0")/.."
DEADLINE=$(( $(date +%s) + ${BUDGET:-520} ))
export PYTHONUNBUFFERED=1

wanted() { if [ -n "${ONLY:-}" ]; then [[ "$1" == "$ONLY"* ]]; else [ "$1" != scaling ]; fi; }
step() {  # name limit command...: runs unless ONLY excludes it or the deadline is near; log OUT/<name>.txt
  local name=$1 limit=$2; shift 2
  wanted "$name" || return 0
  local left=$(( DEADLINE - $(date +%s) ))
  if [ "$left" -lt 20 ]; then echo "== $name skipped: the deadline (BUDGET) is reached"; return 0; fi
  [ "$limit" -gt "$left" ] && limit=$left
  local t0; t0=$(date +%s)
  echo "== $name (limit $limit s)"
  timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
  echo "== $name exit $? in $(( $(date +%s) - t0 )) s"
  tail -n "${TAIL:-4}" "$OUT/$name.txt"
}
scale() {  # model preset limit [overrides...]
  local model=$1 preset=$2 limit=$3; shift 3
  local args=(); [ "$preset" != default ] && args=(--preset "$preset")
  step "scale_${model}_${preset}" "$limit" python3 benchmarks/bench_scale.py --model "$model" "${args[@]}" \
      --iterations 1 --warmup 1 --output-dir "$OUT/runs" --out "$OUT/scale_${model}_${preset}.json" \
      train.mixed_precision=bf16 "$@" ${EXTRA:-}
}

nvidia-smi -L 2>/dev/null
step ops_tests 110 python3 -m pytest -q -p no:cacheprovider -m gpu tests/likelihood/test_ops.py
step bench_ops 45 python3 benchmarks/bench_ops.py --no-compile --device cuda
scale sd3_5_medium flow_grpo 110 sampling.plan.group_size=16 sampling.plan.num_steps=10 sampling.guidance_scale=4.5 \
    train.prompts_per_iteration=2
if [ -n "${FLOW_GRPO_PATH:-}" ]; then
  TAIL=12 step bench_peer 150 python3 benchmarks/bench_peer.py --flow-grpo "$FLOW_GRPO_PATH" --model sd3_5_medium \
      --random-weights --threads 0 --repeats 2 --prompts 1 --group 16 --steps 10 --micro-batch 16 \
      train.mixed_precision=bf16 ${EXTRA:-}
fi
scale flux_dev default 90 train.prompts_per_iteration=1 sampling.plan.group_size=8
scale wan2_1_t2v_1_3b default 120 train.prompts_per_iteration=1 sampling.plan.group_size=2 train.micro_batch=2
step preset_tests 80 python3 -m pytest -q -p no:cacheprovider -m gpu -x tests/engine/test_train_presets.py
scale sd3_5_medium default 60 train.prompts_per_iteration=1 sampling.plan.group_size=16
step scaling 200 bash benchmarks/gpu_scaling_check.sh "$OUT/scaling"
