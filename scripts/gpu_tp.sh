#!/usr/bin/env bash
# Tensor parallel on nvidia-h200-x2 in one call (<= ~8 min; every step has its own
# timeout inside a total budget, and a failed step never stops the others):
#   1. TP=2 == TP=1 in float32 on the GPUs (tests/engine/worker/distributed/test_tp_engine.py, llama + cancel)
#   2. batch-1 decode, bf16 dummy:llama-3.1-8b, TP=1 and TP=2 (median of 3 runs): step
#      time (TPOT), rank 0's host time per step, its broadcast time (scripts/tp_step_time.py)
#   3. the all-reduces' share of the TP=2 step: the same batch-1 run with every all-reduce
#      dropped (tp_step_time.py --noop-all-reduce)
#   4. W1-style throughput TP=1 vs TP=2 (roseplay.bench.inproc --repeat 3)
#   5. the captured all-reduces of one decode step alone (scripts/allreduce_cost.py)
# Logs under $OUT; a summary table at the end.
#   scripts/gpu_tp.sh            # on the GPUs
#   scripts/gpu_tp.sh --dry-run  # the same steps on the CPU, tiny model (checks the script)
set -u
OUT=${OUT:-gpu_tp}; mkdir -p "$OUT"
BUDGET_S=${BUDGET_S:-470}
START=$SECONDS
if [ "${1:-}" = "--dry-run" ]; then
  DEV=cpu; MODEL=dummy:tiny; DTYPE=float32; TEST_DEV=cpu
  B1="--steps 16 --input-len 32 --repeat 3"
  W1="--num-prompts 8 --input-len 32 --output-len 8 --warmup 2"
  AR="--device cpu --hidden 256 --layers 2 --batch 1,64"
else
  DEV=cuda; MODEL=dummy:llama-3.1-8b; DTYPE=bfloat16; TEST_DEV=cuda
  B1="--steps 128 --input-len 512 --repeat 3"
  W1="--num-prompts 256 --input-len 512 --output-len 128 --max-num-batched-tokens 8192 --max-num-seqs 256 --warmup 16"
  AR="--hidden 4096 --layers 32 --batch 1,64,256"
fi
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
{ nvidia-smi -L 2>/dev/null; date -u; grep -m1 "model name" /proc/cpuinfo; nproc; } | tee "$OUT/host.log"
declare -A RC

# run NAME LIMIT_S CMD...: output in $OUT/NAME.log; skipped when the budget is spent
run() {
  local name=$1 limit=$2; shift 2
  local left=$((BUDGET_S - (SECONDS - START)))
  if [ "$left" -lt 20 ]; then echo "== $name: skipped (budget spent)"; RC[$name]=skipped; return; fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "== $name (limit ${limit}s, $((SECONDS - START))s in)"
  timeout -k 10 "$limit" "$@" > "$OUT/$name.log" 2>&1
  RC[$name]=$?
  tail -n 2 "$OUT/$name.log"
}

STEP="python3 scripts/tp_step_time.py --model $MODEL --device $DEV --dtype $DTYPE $B1 --timeout-s"
BENCH="python3 -m roseplay.bench.inproc --no-progress --in-process --model $MODEL --device $DEV --dtype $DTYPE $W1 --repeat 3"
ROSEPLAY_TEST_DEVICE=$TEST_DEV run equality 170 python3 -m pytest tests/engine/worker/distributed/test_tp_engine.py -q \
  -p no:cacheprovider -k "(equals_tp1 and llama) or cancel"
run b1_tp1 80 $STEP 75 --tp 1
run b1_tp2 80 $STEP 75 --tp 2
run b1_tp2_noop_allreduce 80 $STEP 75 --tp 2 --noop-all-reduce
# W1 with decode-only graphs: ~20 mixed-step captures of an 8B model per start would
# spend this call's budget (the mixed graphs under TP are covered by the equality test)
run w1_tp1 90 $BENCH --tensor-parallel-size 1 --cudagraph-mode ${W1_CUDAGRAPH_MODE:-full_decode_only}
run w1_tp2 90 $BENCH --tensor-parallel-size 2 --cudagraph-mode ${W1_CUDAGRAPH_MODE:-full_decode_only}
run allreduce 45 python3 scripts/allreduce_cost.py $AR --timeout-s 40

# -- summary ------------------------------------------------------------------------------
field() { grep -o "$2=[0-9.]*" "$OUT/$1.log" 2>/dev/null | tail -1 | cut -d= -f2; }
step_row() {   # name: step median (min..max), host, broadcast
  local f="$OUT/$1.log"
  if grep -q "^summary" "$f" 2>/dev/null; then
    local line; line=$(grep "^summary" "$f" | tail -1)
    printf "%-24s %8s ms (%s..%s)  host %s ms  bcast %s ms  rc=%s\n" "$1" \
      "$(echo "$line" | grep -o 'step_ms=[0-9.]*' | cut -d= -f2)" \
      "$(echo "$line" | grep -o ' min=[0-9.]*' | cut -d= -f2)" \
      "$(echo "$line" | grep -o ' max=[0-9.]*' | cut -d= -f2)" \
      "$(echo "$line" | grep -o 'host_ms=[0-9.]*' | cut -d= -f2)" \
      "$(echo "$line" | grep -o 'bcast_ms=[0-9.]*' | cut -d= -f2)" "${RC[$1]:-?}"
  else
    printf "%-24s no result  rc=%s\n" "$1" "${RC[$1]:-?}"
  fi
}
{
  echo; echo "==== summary ($MODEL, $DEV, $DTYPE; $((SECONDS - START)) s) ===="
  echo "equality test: rc=${RC[equality]:-?}  $(grep -E 'passed|failed|error' "$OUT/equality.log" 2>/dev/null | tail -1)"
  echo "batch-1 decode step (median of 3 runs, min..max):"
  for n in b1_tp1 b1_tp2 b1_tp2_noop_allreduce; do step_row $n; done
  t2=$(field b1_tp2 step_ms); t0=$(field b1_tp2_noop_allreduce step_ms)
  if [ -n "$t2" ] && [ -n "$t0" ]; then
    python3 -c "t2,t0=$t2,$t0; print(f'all-reduce share of the TP=2 step: {t2-t0:.3f} ms of {t2:.3f} ms = {100*(t2-t0)/t2:.1f}%')"
  fi
  grep "^allreduce" "$OUT/allreduce.log" 2>/dev/null | sed 's/^/captured alone: /'
  echo "W1 throughput (output tok/s, median of 3):"
  for n in w1_tp1 w1_tp2; do
    echo "  $n: $(grep -m1 -A1 '^output throughput' "$OUT/$n.log" 2>/dev/null | tr -s ' \n' ' ')rc=${RC[$n]:-?}"
  done
} | tee "$OUT/summary.log"
