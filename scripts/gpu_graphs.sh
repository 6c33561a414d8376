#!/usr/bin/env bash
# Mixed-step CUDA graphs on one GPU, one call (~8 min): the kernel and engine GPU tests,
# then W1 (burst) and the closed loop with mixed-step graphs on (cudagraph_mode=full)
# and off (full_decode_only: mixed steps eager, as before), and batch 1; a compact
# summary at the end (full logs in $OUT). Every step has its own timeout; a failing
# step is reported and the script goes on.
#   bash scripts/gpu_graphs.sh        (wheels in .whl are installed first if present)
set -u
OUT=${OUT:-gpu_graphs}
source "$(dirname "$0")/gpu_common.sh"

PHASES=${PHASES:-tests bench closed}   # split over two calls when the call limit binds
PYTEST="python3 -m pytest -q -p no:cacheprovider -o addopts= -x"
if [[ " $PHASES " == *" tests "* ]]; then
step kernel_tests 120 $PYTEST tests/test_unified_attention.py \
  tests/test_kernels_gpu.py -k "gpu or extend or graph"
tail -3 "$OUT/kernel_tests.log" | tee -a "$SUMMARY"
step engine_tests 240 ${PYTEST% -x} tests/test_step_graphs_gpu.py tests/test_engine_gpu.py \
  -k "not hf_fp32"
tail -3 "$OUT/engine_tests.log" | tee -a "$SUMMARY"
fi

M=${MODEL:-dummy:qwen2.5-0.5b}
W1="--scenario random --num-prompts 256 --input-len 512 --output-len 128 \
--max-num-batched-tokens 8192 --max-num-seqs 256 --warmup 16"
B1="--scenario random --num-prompts 1 --input-len 512 --output-len 128 --warmup 2"
for mode in full full_decode_only; do
  export ROSEPLAY_CUDAGRAPH_MODE=$mode
  if [[ " $PHASES " == *" bench "* ]]; then
  step "W1_$mode" 110 python3 -m roseplay bench --no-progress --repeat 5 --model "$M" $W1
  grep -E "^runs|^output throughput|^median|^host share|Median TTFT" "$OUT/W1_$mode.log" \
    | tail -5 | tee -a "$SUMMARY"
  fi
  if [[ " $PHASES " == *" closed "* ]]; then   # closed loop: the 'alone' windows
  step "closed_$mode" 150 python3 scripts/observer_cost.py --model "$M" --seconds 10 \
    --warmup 20 --alternate 1
  grep -E "tok/s|median" "$OUT/closed_$mode.log" | tail -4 | tee -a "$SUMMARY"
  fi
done
export ROSEPLAY_CUDAGRAPH_MODE=full
[[ " $PHASES " == *" closed "* ]] && step B1_full 60 python3 -m roseplay bench --no-progress --repeat 3 --model "$M" $B1
grep -E "^output throughput|^median|Median TPOT|^host share" "$OUT/B1_full.log" | tail -4 \
  | tee -a "$SUMMARY"
echo; echo "==== summary"; cat "$SUMMARY"
