#!/usr/bin/env bash
# Every GPU number of flowgrpo in one pass on one CUDA GPU (H100/H200), in about 8 minutes; results go to OUT_DIR:
#   [FLOW_GRPO_PATH=<checkout of yifan123/flow_grpo>] bash benchmarks/gpu_check.sh OUT_DIR
# Steps, most important first, each under its own time limit and all under one deadline (BUDGET seconds, default
# 520), so that a failing or slow step leaves the others' results (OUT_DIR/<step>.txt, scale rows also as .json):
#   scale_*       bench_scale.py at real size, random weights of the real architectures (one warm-up, one measured
#                 iteration): SD3.5-Medium with Flow-GRPO (512 px, group 16, 10 SDE steps, CFG 4.5) with the speed
#                 levers off, then sampling.merge_lora; Wan2.1-1.3B (81 frames at 480x832, group 2; its memory plan
#                 beside the measured peak), then with the video memory options (chunk 1, host latents, text encoders
#                 and activations offloaded); SD3.5-Medium with model.compile too (minutes of compilation), compiled
#                 without the merge, and with CUDA graphs; Qwen-Image at VeRL-Omni's published setting; FLUX.1-dev
#                 with the default (DiffusionNFT, 512 px, group 8); SD3.5-Medium with the default (group 16)
#   ops_tests     the CUDA likelihood op's GPU tests (values, gradients, reproducibility, agreement with the CPU)
#   bench_ops     bench_ops.py --device cuda: the fused op against eager PyTorch, achieved bandwidth
#   bench_peer    with FLOW_GRPO_PATH: the equal-work comparison with the reference code at SD3.5-Medium size,
#                 bf16, flowgrpo with its speed levers (equality of log-probs first, then the timing)
#   preset_tests  every preset end to end on CUDA (tiny model)
#   scaling       only with ONLY=scaling: sharding and the memory plan (benchmarks/gpu_scaling_check.sh)
# ONLY="<step prefix> ..." runs the matching steps alone; the runs' folders go to RUNS (default /tmp/gpu_check_runs).
# A dry run of the image scale rows on a CPU (one block of each real architecture, small pictures; minutes, over the
# GPU limits, so SLOW=10 multiplies each step's limit): ONLY=scale_sd3 SLOW=10 BUDGET=3000 EXTRA="model.depth=1 model.dtype=float32 train.cpu=true model.resolution=32
# model.width=32 model.max_sequence_length=16 model.compile_backend=aot_eager" bash ...; the video row adds
# model.num_frames=5 (ONLY=scale_wan; an image family refuses it).
# Measured on an H200 on 2026-11-27 and 2026-11-28: docs/results/real_size_gpu.md (which steps ran, and which are left).
set -u
OUT=$(mkdir -p "${1:?give an output folder}" && cd "$1" && pwd)
cd "$(dirname "$0")/.."
DEADLINE=$(( $(date +%s) + ${BUDGET:-520} ))
export PYTHONUNBUFFERED=1

wanted() {  # ONLY: space-separated step-name prefixes
  if [ -z "${ONLY:-}" ]; then [ "$1" != scaling ]; return; fi
  local p; for p in $ONLY; do [[ "$1" == "$p"* ]] && return 0; done; return 1
}
step() {  # name limit command...: runs unless ONLY excludes it or the deadline is near; log OUT/<name>.txt
  local name=$1 limit=$(( $2 * ${SLOW:-1} )); shift 2
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
scale() {  # name model preset limit [overrides...]: bench_scale.py at real size, one warm-up and one measured iteration
  local name=$1 model=$2 preset=$3 limit=$4; shift 4
  local args=(); [ "$preset" != default ] && args=(--preset "$preset")
  step "$name" "$limit" python3 benchmarks/bench_scale.py --model "$model" "${args[@]}" \
      --iterations 1 --warmup 1 --output-dir "${RUNS:-/tmp/gpu_check_runs}" --out "$OUT/$name.json" \
      train.mixed_precision=bf16 "$@" ${EXTRA:-}
}
# SD3.5-Medium with Flow-GRPO as the speed target states it (512 px, group 16, 10 SDE steps, CFG 4.5), one prompt
# and micro-batches of 16 transitions (32 network rows with CFG, as the rollout's calls: one shape to compile)
SD3_FLOW_GRPO=(sd3_5_medium flow_grpo sampling.plan.group_size=16 sampling.plan.num_steps=10 sampling.guidance_scale=4.5
               train.prompts_per_iteration=1 train.micro_batch=16)

nvidia-smi -L 2>/dev/null
# the speed levers one by one on SD3.5-Medium (each row adds one to the row before; the first compiles for minutes)
scale scale_sd3_5_medium_flow_grpo "${SD3_FLOW_GRPO[@]:0:2}" 90 "${SD3_FLOW_GRPO[@]:2}"
scale scale_sd3_5_medium_flow_grpo_merged "${SD3_FLOW_GRPO[@]:0:2}" 90 "${SD3_FLOW_GRPO[@]:2}" sampling.merge_lora=true
scale scale_wan2_1_t2v_1_3b_default wan2_1_t2v_1_3b default 120 train.prompts_per_iteration=1 sampling.plan.group_size=2 \
    train.micro_batch=2
# the same with what a video sample holds moved off the GPU (docs/scaling.md): its measured peak against its plan
scale scale_wan2_1_t2v_1_3b_video_memory wan2_1_t2v_1_3b default 150 train.prompts_per_iteration=1 \
    sampling.plan.group_size=2 train.micro_batch=2 sampling.chunk=1 sampling.latent_storage=host \
    model.offload_text_encoders=true train.activation_offload=true
scale scale_sd3_5_medium_flow_grpo_compiled "${SD3_FLOW_GRPO[@]:0:2}" 300 "${SD3_FLOW_GRPO[@]:2}" sampling.merge_lora=true \
    model.compile=true
# compiled alone, and compiled with CUDA graphs (inductor's reduce-overhead): what each adds
scale scale_sd3_5_medium_flow_grpo_compile_only "${SD3_FLOW_GRPO[@]:0:2}" 300 "${SD3_FLOW_GRPO[@]:2}" model.compile=true
scale scale_sd3_5_medium_flow_grpo_cudagraphs "${SD3_FLOW_GRPO[@]:0:2}" 300 "${SD3_FLOW_GRPO[@]:2}" sampling.merge_lora=true \
    model.compile=true model.compile_mode=reduce-overhead
# Qwen-Image with the setting VeRL-Omni publishes its per-GPU throughput for (Flow-GRPO, OCR, LoRA rank 64, 16 images a
# prompt, micro-batches of 16; 0.305 images/GPU/s on 4 H800): one prompt here, the model config's size and steps
scale scale_qwen_image_flow_grpo qwen_image flow_grpo 300 sampling.plan.group_size=16 train.prompts_per_iteration=1 \
    train.micro_batch=16 model.lora_rank=64 model.lora_alpha=128 sampling.merge_lora=true model.compile=true
step ops_tests 110 python3 -m pytest -q -p no:cacheprovider -m gpu tests/likelihood/test_ops.py
step bench_ops 45 python3 benchmarks/bench_ops.py --no-compile --device cuda
if [ -n "${FLOW_GRPO_PATH:-}" ]; then
  # flowgrpo with its speed levers against the reference code as published (eager; bench_peer's Peer.as_published)
  TAIL=12 step bench_peer 400 python3 benchmarks/bench_peer.py --flow-grpo "$FLOW_GRPO_PATH" --model sd3_5_medium \
      --random-weights --threads 0 --repeats 2 --prompts 1 --group 16 --steps 10 --micro-batch 16 \
      train.mixed_precision=bf16 model.compile=true sampling.merge_lora=true ${EXTRA:-}
fi
scale scale_flux_dev_default flux_dev default 90 train.prompts_per_iteration=1 sampling.plan.group_size=8
step preset_tests 80 python3 -m pytest -q -p no:cacheprovider -m gpu -x tests/engine/test_train_presets.py
scale scale_sd3_5_medium_default sd3_5_medium default 60 train.prompts_per_iteration=1 sampling.plan.group_size=16
step scaling 200 bash benchmarks/gpu_scaling_check.sh "$OUT/scaling"
