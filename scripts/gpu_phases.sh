#!/usr/bin/env bash
# One GPU call made of phases (sessions 5 and 6): GPU engine tests (graphs vs eager,
# async vs sync, PDL), prefill TFLOP/s, batch-1 graph kernels and an A/B of the GEMV's
# weight preload, the host work per step on this host (stub forward), W1 and batch 1
# (5 runs each), the closed loop and the TUI's cost (alternating windows on one engine),
# the HF peer. Each phase has its own timeout; a compact summary at the end.
#   PHASES="tests host bench observer closed30 hf" bash scripts/gpu_phases.sh   (wheels in .whl)
#   MODEL=dummy:llama-3.2-1b CLOSED_S=15 PHASES="bench closed30" OUT=... bash scripts/gpu_phases.sh
set -u
OUT=${OUT:-gpu_phases}
source "$(dirname "$0")/gpu_common.sh"
PHASES=${PHASES:-tests bench observer}
M=${MODEL:-dummy:qwen2.5-0.5b}
if [[ " $PHASES " == *" tests "* ]]; then
  step engine_tests ${TESTS_S:-420} python3 -m pytest -q -p no:cacheprovider -o addopts= \
    ${GPU_TESTS:-tests/test_kernels_gpu.py tests/test_kernels_gpu_linear.py tests/test_device_io_gpu.py tests/test_step_graphs_gpu.py tests/test_engine_gpu.py} ${GPU_TESTS_K:+-k "$GPU_TESTS_K"}
  tail -3 "$OUT/engine_tests.log" | tee -a "$SUMMARY"
fi
if [[ " $PHASES " == *" prefill "* ]]; then   # prefill TFLOP/s, 5 runs, and its kernels
  step prefill 150 python3 scripts/profile_prefill.py --model "$M" --repeat ${PREFILL_REPEAT:-5} ${PREFILL_ARGS:-}
  grep -E "^prefill" "$OUT/prefill.log" | tee -a "$SUMMARY"
fi
if [[ " $PHASES " == *" replay "* ]]; then   # kernels inside the batch-1 decode graph
  step replay 120 python3 scripts/profile_replay.py --model "$M" --batches ${REPLAY_BATCHES:-1}
  grep -E "^---" "$OUT/replay.log" | tee -a "$SUMMARY"
fi
if [[ " $PHASES " == *" ab "* ]]; then   # decode step/replay of VARIANTS, alternating, one engine
  step ab ${AB_S:-300} python3 scripts/profile_step.py --model "$M" --batches ${AB_BATCHES:-1,4,16,32} \
    --rounds ${AB_ROUNDS:-2} --variants "$VARIANTS" ${AB_ARGS:-}
  grep -E "^ +[0-9]+ +[0-9]+ +[0-9]+ " "$OUT/ab.log" | tee -a "$SUMMARY"
fi
if [[ " $PHASES " == *" timeline "* ]]; then   # the GPU between two batch-1 decode graphs
  step timeline 150 python3 scripts/step_timeline.py --model "$M" --batch ${TL_BATCH:-1} ${TL_ARGS:-}
  grep -E "^batch" "$OUT/timeline.log" | tee -a "$SUMMARY"
fi
if [[ " $PHASES " == *" hostops "* ]]; then   # host µs of each call of a batch-1 step
  step hostops 150 python3 scripts/host_ops_gpu.py --model "$M" ${HOSTOPS_ARGS:-}
  grep -E "^step|us \\(" "$OUT/hostops.log" | tee -a "$SUMMARY"
fi
if [[ " $PHASES " == *" host "* ]]; then
  step host_step 90 python3 scripts/host_step_profile.py --repeat 5
  tail -1 "$OUT/host_step.log" | tee -a "$SUMMARY"
  step host_decode 90 python3 scripts/host_step_profile.py --repeat 5 --output-len 100000
  tail -1 "$OUT/host_decode.log" | tee -a "$SUMMARY"
  step host_decode_runner 90 python3 scripts/host_step_profile.py --repeat 5 --output-len 100000 --runner
  tail -1 "$OUT/host_decode_runner.log" | tee -a "$SUMMARY"
fi
W1="--scenario random --num-prompts 256 --input-len 512 --output-len 128 \
--max-num-batched-tokens 8192 --max-num-seqs 256 --warmup 16"
B1="--scenario random --num-prompts 1 --input-len 512 --output-len 128 --warmup 2"
if [[ " $PHASES " == *" bench "* ]]; then
  step W1 120 python3 -m roseplay bench --no-progress --repeat 5 --model "$M" $W1 --json "$OUT/W1.json"
  grep -E "^runs|^output throughput|^median|^host share|Median TTFT" "$OUT/W1.log" | tail -5 | tee -a "$SUMMARY"
  if [[ " ${BENCH_RUNS:-W1 B1} " == *" B1 "* ]]; then
    step B1 90 python3 -m roseplay bench --no-progress --repeat 5 --model "$M" $B1
    grep -E "^runs|^output throughput|^median|Median TPOT|^host share" "$OUT/B1.log" | tail -5 | tee -a "$SUMMARY"
  fi
fi
if [[ " $PHASES " == *" spy "* ]]; then   # py-spy of the engine process during W1 and B1
  python3 -m pip install -q --no-index --no-deps --target /tmp/spy .dev/py_spy*.whl
  for w in ${SPY_RUNS:-W1 B1}; do   # SPY_ARGS="--native": C frames too (pauses the process)
    if [[ $w == W1 ]]; then args="$W1 --repeat 8"; else args="$B1 --output-len 4096 --repeat 4"; fi
    python3 -m roseplay bench --no-progress --model "$M" $args > "$OUT/spy_$w.bench.log" 2>&1 &
    bpid=$!
    for i in $(seq 100); do pid=$(pgrep -n -f engine.ipc.core_proc); [[ -n $pid ]] && break; sleep 0.3; done
    timeout 150 /tmp/spy/bin/py-spy record -p "$pid" -r 400 -f raw -o "$OUT/spy_$w.txt" \
      --threads ${SPY_ARGS:---nonblocking} -d 140 > "$OUT/spy_$w.log" 2>&1 &
    spid=$!
    timeout 150 tail --pid=$bpid -f /dev/null
    kill -INT $spid 2>/dev/null; wait $spid
    grep -E "^output throughput|^median|^host share" "$OUT/spy_$w.bench.log" | tail -3 | sed "s/^/spy $w: /" | tee -a "$SUMMARY"
  done
fi
if [[ " $PHASES " == *" observer "* ]]; then
  step observer 200 python3 scripts/observer_cost.py --model "$M" --seconds ${WINDOW:-8} \
    --warmup 15 --alternate ${ALTERNATE:-4}
  grep -E "alone|tui|median" "$OUT/observer.log" | tail -12 | tee -a "$SUMMARY"
fi
if [[ " $PHASES " == *" closed30 "* ]]; then   # the closed loop alone, 30 s windows
  step closed30 200 python3 scripts/observer_cost.py --model "$M" --seconds ${CLOSED_S:-30} \
    --warmup ${CLOSED_WARMUP:-15} --alternate 2 --view alone
  grep -E "alone" "$OUT/closed30.log" | tail -6 | tee -a "$SUMMARY"
fi
if [[ " $PHASES " == *" hf "* ]]; then   # the HF transformers peer (../shared/tools), same call
  step hf_peer 200 python3 .dev/hf_peer_baseline.py
  grep -E "^HF" "$OUT/hf_peer.log" | tee -a "$SUMMARY"
fi
echo; echo "==== summary"; cat "$SUMMARY"
