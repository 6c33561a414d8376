#!/usr/bin/env bash
# Before/after on one GPU in one call: W1 and batch-1 of an older tree (.dev/before, from
# `git archive <rev>`) and of this tree, 5 measured runs each in one process.
#   bash scripts/gpu_ab.sh    (the older tree's runner: .dev/old_repeat.py)
set -u
OUT=${OUT:-gpu_ab}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
W1="--num-prompts 256 --input-len 512 --output-len 128 --max-num-batched-tokens 8192 --max-num-seqs 256 --warmup 16 --repeat 5"
B1="--num-prompts 1 --input-len 512 --output-len 128 --warmup 2 --repeat 5"
nvidia-smi -L; date -u; grep -m1 "model name" /proc/cpuinfo
for model in dummy:qwen2.5-0.5b; do
  for wl in W1 B1; do
    echo "== before $wl $model"; python3 .dev/old_repeat.py .dev/before --model $model ${!wl} --no-progress 2>&1 | tail -2
    echo "== after  $wl $model"; python3 -m roseplay.bench --model $model ${!wl} --no-progress 2>&1 | grep -E "^runs|^output throughput|median|CPU" | tail -3
  done
done
