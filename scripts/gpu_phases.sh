#!/usr/bin/env bash
# The GPU run script: one device call made of phases, each with its own timeout and a
# compact summary at the end (full logs in $OUT). Phases (PHASES, default "tests bench observer"):
#   tests     every gpu-marked test under GPU_TESTS (tests/kernels tests/engine), GPU_TESTS_K
#   prefill   prefill TFLOP/s (5 runs) and its kernels      replay    kernels of the batch-1 graph
#   preload   GEMV weight preload on/off                    ab        profile_step.py VARIANTS
#   timeline  the GPU between two batch-1 graphs            hostops   host us of each call
#   host      host work per step (stub forward)             bench     W1 and batch 1, 5 runs each
#   graphs    W1 and the closed loop with mixed-step graphs on (cudagraph_mode=full) and off
#   kvdtype   W1 and batch 1 (5 runs each) with --kv-cache-dtype auto and fp8 on KV_MODELS
#             (default dummy:qwen3-0.6b dummy:qwen2.5-0.5b), the fp8 / auto ratio of each
#   kvacc     fp8 KV's first-token logprob error and greedy agreement against bfloat16
#   before_after  W1 (WORKLOADS="W1 B1") of an older tree (BASE) and this tree, alternating
#   design    the three --ab runs of docs/PERF.md (max_num_seqs, chunk budget, prefix cache)
#   spy       py-spy of the engine process              observer  the TUI's cost (alternating)
#   closed30  the closed loop alone, 30 s windows        hf        the HF transformers peer
#   verify    the verify graph against the decode graph (VERIFY_BATCHES, default 1 4 16) and
#             the batch-1 speculation sweep (k = 3, p 0 / 0.8 / 1, 5 runs)
#   PHASES="tests host bench observer closed30 hf" bash scripts/gpu_phases.sh   (wheels in .whl)
#   MODEL=dummy:llama-3.2-1b CLOSED_S=15 PHASES="bench closed30" OUT=... bash scripts/gpu_phases.sh
#   PHASES="kvdtype" OUT=... bash scripts/gpu_phases.sh       (KV_MODELS=dummy:qwen3-0.6b: one model)
#   git archive <rev> | tar -x -C .dev/before; BASE=.dev/before PHASES=before_after bash scripts/gpu_phases.sh
# Tensor parallel runs on two GPUs: scripts/gpu_tp.sh; the HTTP server: scripts/gpu_serve.sh.
set -u
OUT=${OUT:-gpu_phases}
source "$(dirname "$0")/gpu_common.sh"
PHASES=${PHASES:-tests bench observer}
M=${MODEL:-dummy:qwen2.5-0.5b}
if [[ " $PHASES " == *" tests "* ]]; then
  # every test marked gpu (a list of files went stale: tests it missed failed unseen); the
  # device lacks some CPU-only wheels, so a module that cannot import is reported, not fatal
  step engine_tests ${TESTS_S:-540} python3 -m pytest -q -p no:cacheprovider -o addopts= -m gpu \
    --continue-on-collection-errors ${GPU_TESTS:-tests/kernels tests/engine} ${GPU_TESTS_K:+-k "$GPU_TESTS_K"}
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
if [[ " $PHASES " == *" verify "* ]]; then   # a verify step's graph, and the batch-1 sweep
  for b in ${VERIFY_BATCHES:-1 4 16}; do
    step verify_b$b 120 python3 scripts/verify_replay.py --model "$M" --batch $b
    grep -E "graph|verify /" "$OUT/verify_b$b.log" | tee -a "$SUMMARY"
  done
  step spec_b1 200 python3 scripts/spec_sweep.py --model "$M" --batches 1 --ks 3 \
    --ps 0,0.8,1.0 --repeat 5
  grep -E "^batch" "$OUT/spec_b1.log" | tee -a "$SUMMARY"
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
if [[ " $PHASES " == *" kvdtype "* ]]; then   # W1 and batch 1, --kv-cache-dtype auto vs fp8
  tok() { grep -o "output throughput: median [0-9.,]*" "$OUT/$1.log" | grep -o "[0-9.,]*$" | tr -d ,; }
  for m in ${KV_MODELS:-dummy:qwen3-0.6b dummy:qwen2.5-0.5b}; do
    for wl in ${KV_RUNS:-W1 B1}; do
      for kv in auto fp8; do    # KV_ARGS=--calculate-kv-scales: the fp8 side's scales calculated
        name="${wl}_${m#dummy:}_$kv"
        step "$name" ${KV_S:-150} python3 -m roseplay bench --no-progress --repeat 5 --model "$m" \
          ${!wl} --kv-cache-dtype $kv $( [ $kv = fp8 ] && echo ${KV_ARGS:-} )
        grep -E "^Peak KV|^runs|^output throughput|^median|^TPOT p50" "$OUT/$name.log" | tail -5 \
          | sed "s/^/$name: /" | tee -a "$SUMMARY"
      done
      awk -v a="$(tok "${wl}_${m#dummy:}_auto")" -v f="$(tok "${wl}_${m#dummy:}_fp8")" \
        -v n="$wl ${m#dummy:}" 'BEGIN { printf "%s: fp8 / auto output throughput (medians) %.2fx\n",
        n, (a > 0 ? f / a : 0) }' | tee -a "$SUMMARY"
    done
  done
fi
if [[ " $PHASES " == *" kvacc "* ]]; then   # fp8 KV's accuracy against bfloat16 (docs/KV_TIERS.md)
  step kv_accuracy ${KVACC_S:-400} python3 -m pytest -q -s -p no:cacheprovider -o addopts= \
    tests/engine/worker/test_kv_fp8_accuracy.py -k gpu
  grep -E "cuda fp8|passed|failed" "$OUT/kv_accuracy.log" | tee -a "$SUMMARY"
fi
if [[ " $PHASES " == *" graphs "* ]]; then   # mixed-step CUDA graphs on and off
  for mode in full full_decode_only; do
    step "W1_$mode" 110 python3 -m roseplay bench --no-progress \
      --repeat 5 --model "$M" $W1 --cudagraph-mode $mode
    grep -E "^runs|^output throughput|^median|^host share|Median TTFT" "$OUT/W1_$mode.log" \
      | tail -5 | tee -a "$SUMMARY"
    step "closed_$mode" 150 python3 scripts/observer_cost.py \
      --model "$M" --seconds 10 --warmup 20 --alternate 1 --cudagraph-mode $mode
    grep -E "tok/s|median" "$OUT/closed_$mode.log" | tail -4 | tee -a "$SUMMARY"
  done
fi
if [[ " $PHASES " == *" before_after "* ]]; then   # an older tree (BASE, with bench --repeat) vs this one
  BASE=${BASE:-.dev/before}; LOGS=$(cd "$OUT" && pwd)
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
fi
if [[ " $PHASES " == *" design "* ]]; then   # the design notes' three A/B runs
  B="python3 -m roseplay bench --no-progress --model $M"
  step design_seqs 150 $B --scenario random --num-prompts 32 --input-len 16 --output-len 8 \
    --max-num-batched-tokens 8192 --warmup 8 --ab max_num_seqs=64,1
  step design_chunk 200 $B --scenario long-short --num-prompts 64 --input-len 4096 --output-len 64 \
    --submit-interval-ms 20 --max-num-seqs 8 --warmup 8 --ab max_num_batched_tokens=8192,224
  step design_prefix 150 $B --scenario identical --num-prompts 512 --input-len 65 --output-len 2 \
    --max-num-seqs 512 --max-num-batched-tokens 8192 --warmup 8 --ab enable_prefix_caching=true,false
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
