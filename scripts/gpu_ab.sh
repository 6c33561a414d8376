#!/usr/bin/env bash
# Before/after on one GPU in one call: W1 (and batch 1 with WORKLOADS="W1 B1") of an
# older tree and of this tree, alternating PASSES times, `roseplay bench --repeat 5`
# each (so the host's drift hits both). The older tree must have `bench --repeat`:
#   git archive <rev> | tar -x -C .dev/before   (.dev is ignored; carry it)
#   BASE=.dev/before PASSES=2 bash scripts/gpu_ab.sh
set -u
OUT=${OUT:-gpu_ab}
source "$(dirname "$0")/gpu_common.sh"
BASE=${BASE:-.dev/before}
M=${MODEL:-dummy:qwen2.5-0.5b}
LOGS=$(cd "$OUT" && pwd)
W1="--scenario random --num-prompts 256 --input-len 512 --output-len 128 \
--max-num-batched-tokens 8192 --max-num-seqs 256 --warmup 16"
B1="--scenario random --num-prompts 1 --input-len 512 --output-len 128 --warmup 2"
for i in $(seq ${PASSES:-2}); do
  for wl in ${WORKLOADS:-W1}; do
    for tree in "$BASE" .; do
      name=$( [ "$tree" = . ] && echo after || echo before )_${wl}_$i
      (cd "$tree" && timeout 120 python3 -m roseplay bench --no-progress --repeat 5 \
        --model "$M" ${!wl} > "$LOGS/$name.log" 2>&1)
      echo "$name: $(grep -E '^runs' "$LOGS/$name.log") | $(grep -o 'host share.*' \
        "$LOGS/$name.log" | tail -1)" | tee -a "$SUMMARY"
    done
  done
done
