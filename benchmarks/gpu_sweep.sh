#!/usr/bin/env bash
# Measured calibration rows from this machine's GPU: `tuneplan measure` over small and mid models built
# from their config.json with random weights (no download), across full / LoRA / QLoRA, checkpointing on
# and off, eager vs SDPA attention, batch and sequence length. Each run is its own process (clean CUDA
# context and peak counters) and appends one row, in the columns of
# benchmarks/data/calibration/measured.csv, to benchmarks/data/measured_tuneplan.csv (or $OUT). An OOM is a
# row too (outcome OOM).
#
#   bash benchmarks/gpu_sweep.sh              # quick: ~20 runs, 0.5B-3B, about 5-8 minutes on an H100/H200
#   MODE=full bash benchmarks/gpu_sweep.sh    # adds 7-8B models, long sequences, other optimizers/precisions
#   OUT=/tmp/rows.csv STREAM_OUT=/tmp/gap.jsonl STEPS=4 bash benchmarks/gpu_sweep.sh
#
# Needs a CUDA GPU, torch + transformers + peft (pip install -e '.[simulate,detect]'), and bitsandbytes for
# the QLoRA / 8-bit-optimizer runs (skipped with a note when it is missing). Results: docs/measure.md.
set -uo pipefail
cd "$(dirname "$0")/.."

OUT="${OUT:-benchmarks/data/measured_tuneplan.csv}"
MODE="${MODE:-quick}"
STEPS="${STEPS:-8}"                      # speed is read over steps 2..N: warm steps
RUN_TIMEOUT="${RUN_TIMEOUT:-300}"        # seconds per configuration
BUDGET="${SWEEP_BUDGET_S:-540}"          # stop starting new runs after this many seconds
STREAM_OUT="${STREAM_OUT:-benchmarks/data/stream_gap.jsonl}"
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1                  # catalog configs only; never reach for the Hub
export TOKENIZERS_PARALLELISM=false
TUNEPLAN=(python3 -m tuneplan.cli.app)

if ! python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "gpu_sweep: no CUDA GPU visible to torch; nothing to measure (tuneplan measure --device cpu tests the path)" >&2
  exit 2
fi
HAVE_BNB=1
python3 -c "import bitsandbytes" 2>/dev/null || HAVE_BNB=0
[ "$HAVE_BNB" = 1 ] || echo "gpu_sweep: bitsandbytes missing: QLoRA and 8-bit optimizer runs are skipped" >&2
mkdir -p "$(dirname "$OUT")"
python3 -c "import torch; print('gpu_sweep on', torch.cuda.get_device_name(0), 'torch', torch.__version__)"

# model | setup flags (each line is one configuration)
QUICK=(
  "Qwen/Qwen2.5-0.5B|--method lora --batch 1 --seq 512 --attn sdpa --no-gradient-checkpointing"
  "Qwen/Qwen2.5-0.5B|--method lora --batch 1 --seq 512 --attn eager --no-gradient-checkpointing"
  "Qwen/Qwen2.5-0.5B|--method lora --batch 4 --seq 1024 --attn sdpa --gradient-checkpointing"
  "Qwen/Qwen2.5-0.5B|--method lora --batch 4 --seq 1024 --attn sdpa --no-gradient-checkpointing"
  "Qwen/Qwen2.5-0.5B|--method qlora --batch 1 --seq 512 --attn sdpa"
  "Qwen/Qwen2.5-0.5B|--method qlora --batch 4 --seq 1024 --attn sdpa --no-gradient-checkpointing"
  "Qwen/Qwen2.5-0.5B|--method full --batch 1 --seq 512 --attn sdpa --no-gradient-checkpointing"
  "Qwen/Qwen2.5-0.5B|--method full --batch 4 --seq 2048 --attn sdpa --gradient-checkpointing"
  "meta-llama/Llama-3.2-1B|--method lora --batch 2 --seq 1024 --attn sdpa --no-gradient-checkpointing"
  "meta-llama/Llama-3.2-1B|--method lora --batch 2 --seq 1024 --attn eager --no-gradient-checkpointing"
  "meta-llama/Llama-3.2-1B|--method qlora --batch 2 --seq 1024 --attn sdpa"
  "meta-llama/Llama-3.2-1B|--method full --batch 2 --seq 1024 --attn sdpa --no-gradient-checkpointing"
  "Qwen/Qwen2.5-1.5B-Instruct|--method lora --batch 1 --seq 2048 --attn sdpa --no-gradient-checkpointing"
  "Qwen/Qwen2.5-1.5B-Instruct|--method lora --batch 1 --seq 2048 --attn sdpa --gradient-checkpointing"
  "Qwen/Qwen2.5-1.5B-Instruct|--method qlora --batch 1 --seq 2048 --attn sdpa"
  "Qwen/Qwen2.5-1.5B-Instruct|--method full --batch 1 --seq 1024 --attn sdpa --gradient-checkpointing"
  "Qwen/Qwen2.5-3B|--method lora --batch 2 --seq 1024 --attn sdpa --no-gradient-checkpointing"
  "Qwen/Qwen2.5-3B|--method qlora --batch 2 --seq 1024 --attn sdpa"
  "Qwen/Qwen2.5-3B|--method lora --rank 64 --targets all-linear --batch 1 --seq 2048 --attn sdpa --gradient-checkpointing"
  # the transformers-docs BERT classifier rows (M0249/M0250, torch 1.10: kept gradients and softmax inputs,
  # both emulated by measure on today's torch); these measure allocated and reserved directly, the last one
  # today's torch as it is
  "google-bert/bert-large-uncased|--method full --num-labels 2 --precision fp32 --optimizer adamw-hf --batch 4 --seq 512 --attn eager --no-gradient-checkpointing --torch-era keep_grads,softmax_keeps_input"
  "google-bert/bert-large-uncased|--method full --num-labels 2 --precision fp32 --optimizer adamw-hf --batch 1 --seq 512 --attn eager --no-gradient-checkpointing --torch-era keep_grads,softmax_keeps_input"
  "google-bert/bert-large-uncased|--method full --num-labels 2 --precision fp32 --optimizer adamw-hf --batch 4 --seq 512 --attn eager --no-gradient-checkpointing"
)
FULL=(
  "meta-llama/Llama-3.1-8B|--method lora --batch 1 --seq 2048 --attn sdpa --no-gradient-checkpointing"
  "meta-llama/Llama-3.1-8B|--method lora --batch 4 --seq 2048 --attn sdpa --gradient-checkpointing"
  "meta-llama/Llama-3.1-8B|--method qlora --batch 1 --seq 2048 --attn sdpa"
  "meta-llama/Llama-3.1-8B|--method qlora --batch 4 --seq 4096 --attn sdpa"
  "meta-llama/Llama-3.1-8B|--method full --precision bf16 --optimizer adamw --batch 1 --seq 1024 --attn sdpa --gradient-checkpointing"
  "Qwen/Qwen2.5-7B|--method lora --batch 2 --seq 1024 --attn eager --no-gradient-checkpointing"
  "Qwen/Qwen2.5-7B|--method qlora --rank 64 --targets all-linear --batch 2 --seq 2048 --attn sdpa"
  "Qwen/Qwen2.5-1.5B-Instruct|--method full --optimizer adamw-8bit --batch 2 --seq 1024 --attn sdpa --no-gradient-checkpointing"
  "Qwen/Qwen2.5-1.5B-Instruct|--method full --optimizer paged-adamw-8bit --batch 2 --seq 1024 --attn sdpa --no-gradient-checkpointing"
  "Qwen/Qwen2.5-1.5B-Instruct|--method full --optimizer adafactor --batch 2 --seq 1024 --attn sdpa --no-gradient-checkpointing"
  "Qwen/Qwen2.5-1.5B-Instruct|--method lora --precision fp16-mixed --batch 2 --seq 1024 --attn sdpa --no-gradient-checkpointing"
  "Qwen/Qwen2.5-1.5B-Instruct|--method lora --grad-accum 4 --batch 2 --seq 1024 --attn sdpa --no-gradient-checkpointing"
  "Qwen/Qwen2.5-0.5B|--method lora --batch 1 --seq 8192 --attn sdpa --no-gradient-checkpointing"
  "Qwen/Qwen2.5-0.5B|--method lora --batch 1 --seq 8192 --attn eager --no-gradient-checkpointing"
)
CONFIGS=("${QUICK[@]}")
[ "$MODE" = "full" ] && CONFIGS+=("${FULL[@]}")

start=$(date +%s)
ok=0; failed=0; skipped=0
for entry in "${CONFIGS[@]}"; do
  model="${entry%%|*}"; flags="${entry#*|}"
  if [ "$HAVE_BNB" = 0 ] && [[ "$flags" == *qlora* || "$flags" == *8bit* ]]; then
    skipped=$((skipped + 1)); continue
  fi
  if [ $(( $(date +%s) - start )) -ge "$BUDGET" ]; then
    echo "gpu_sweep: time budget of ${BUDGET}s reached; stopping before: $model $flags" >&2
    break
  fi
  echo "== $model $flags"
  # shellcheck disable=SC2086  # flags are meant to split into arguments
  if timeout "$RUN_TIMEOUT" "${TUNEPLAN[@]}" measure "$model" $flags --steps "$STEPS" --device cuda --record "$OUT"; then
    ok=$((ok + 1))
  else
    echo "gpu_sweep: run failed (exit $?): $model $flags" >&2
    failed=$((failed + 1))
  fi
done
echo "gpu_sweep: $ok recorded, $failed failed, $skipped skipped in $(( $(date +%s) - start ))s -> $OUT"

# Reserved vs allocated when blocks cross streams (FSDP1's all-gather on its own stream, record_stream, the
# rate limiter, GPU work that keeps the CPU ahead): one run on one stream and one on two, appended to
# benchmarks/data/stream_gap.jsonl beside the allocator emulation's figures for the same pattern (one stream;
# two streams, GPU-bound and GPU keeping up), to check the emulation's per-stream rules against this card.
echo "== stream gap (one card, one stream vs two)"
timeout "$RUN_TIMEOUT" python3 benchmarks/stream_gap.py --out "$STREAM_OUT" \
  || echo "gpu_sweep: stream gap run failed (exit $?)" >&2
