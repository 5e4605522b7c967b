#!/usr/bin/env bash
# The GPU checks of sharding and the memory plan, in one command (needs one CUDA GPU; writes into $1):
#   bash benchmarks/gpu_scaling_check.sh OUT_DIR
# 1. FSDP2 on CUDA (NCCL, one process, bf16 weights with the float32 LoRA, float32 reduction): the default
#    (DiffusionNFT) and Flow-GRPO on the shipped tiny model, sharded and not; their metrics side by side.
# 2. bench_memory.py: real-size transformers with random weights, measured GPU memory per item next to the plan.
# 3. The GPU tests: every preset end to end on CUDA and the fused likelihood op.
set -u
OUT=${1:?give an output folder}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
COMMON=(train.iterations=3 eval.every=0 eval.at_start=false log.progress=false log.samples_every=0 log.tensorboard=false
        model.dtype=bfloat16 train.mixed_precision=bf16 train.cpu=false)
for preset in default flow_grpo; do
  args=(); [ "$preset" != default ] && args=(--preset "$preset")
  python3 -m torch.distributed.run --standalone --nproc_per_node 1 train_t2i.py "${args[@]}" "${COMMON[@]}" \
      output_dir="$OUT/plain_$preset" > "$OUT/plain_$preset.log" 2>&1; echo "plain $preset: exit $?"
  ACCELERATE_USE_FSDP=true FSDP_VERSION=2 FSDP_AUTO_WRAP_POLICY=TRANSFORMER_BASED_WRAP \
  python3 -m torch.distributed.run --standalone --nproc_per_node 1 train_t2i.py "${args[@]}" "${COMMON[@]}" \
      output_dir="$OUT/fsdp_$preset" > "$OUT/fsdp_$preset.log" 2>&1; echo "fsdp2 $preset: exit $?"
  python3 - "$OUT/plain_$preset" "$OUT/fsdp_$preset" <<'EOF'
import json, sys
from pathlib import Path
runs = [next(Path(d).glob("*/metrics.jsonl")) for d in sys.argv[1:]]
rows = [[json.loads(line) for line in r.read_text().splitlines()] for r in runs]
keys = [k for k in ("loss", "grad_norm", "max_abs_ratio_minus_1_epoch0", "max_abs_vplus_minus_vold_epoch0") if k in rows[0][0]]
keys += [k for k in rows[0][0] if k.startswith("reward/") and k.endswith("_mean")][:1]
for k in keys:
    print(f"  {k}: plain {[round(r[k], 6) for r in rows[0]]}  fsdp2 {[round(r[k], 6) for r in rows[1]]}")
print("  sharded checkpoint:", sorted(p.name for p in next(Path(sys.argv[2]).glob("*/checkpoints/step_3")).iterdir()))
EOF
done
for model in sd3_5_medium flux_dev wan2_1_t2v_1_3b; do  # one process each: a failure stays with its model
  python3 benchmarks/bench_memory.py --model $model --out "$OUT/memory_lora_$model.json" > "$OUT/memory_lora_$model.log" 2>&1
  echo "bench_memory $model lora: exit $?"; grep -E '^\{|Error' "$OUT/memory_lora_$model.log" | tail -n 2
done
python3 benchmarks/bench_memory.py --model sd3_5_medium --finetune full --micro-batches 1 --out "$OUT/memory_full.json" 2>&1 | tail -n 2
[ "${SKIP_TESTS:-0}" = 1 ] || python3 -m pytest -q -p no:cacheprovider -m gpu tests/engine/test_train_presets.py tests/likelihood/test_ops.py 2>&1 | tail -n 3
