#!/usr/bin/env bash
# One call: W1 through `roseplay serve` next to the direct bench (issue 31; docs/SERVE.md
# "Performance"). In order: the load client's ceiling against canned tokens, the direct
# W1 (--repeat 5), the direct closed loop, then `roseplay serve` + `bench --base-url`
# W1 (--repeat 5, the client's CPU, the server's and engine's CPU; API_SERVERS API-server
# processes, `serve --api-server-count`, default 8; NUM_CLIENTS client processes, default 6), the closed loop of
# CLOSED_INFLIGHT requests in flight through HTTP, W1 from one client process, and last
# py-spy of the server (when installed) over runs of its own. Logs and JSON in $OUT; $OUT/summary.md at the end. About 5 minutes on an H100;
# every step's timeout is cut to what is left of BUDGET_S (default 480 s), so the summary
# is written within one device call even when a step hangs. SKIP="ceiling one_client spy closed"
# leaves those steps out (a repeat of the figures that matter in less device time);
# ADMISSION=1 adds scripts/admission_cost.py (server CPU per request, httptools and h11).
#   bash scripts/gpu_serve.sh                     (wheels in .whl are installed first)
#   MODEL=default DEVICE=cpu NUM_PROMPTS=16 INPUT_LEN=32 OUTPUT_LEN=8 WARMUP=2 REPEAT=2 \
#     CLOSED_PROMPTS=32 CLOSED_INFLIGHT=8 OUT=/tmp/gs bash scripts/gpu_serve.sh   (CPU smoke)
set -u
OUT=${OUT:-gpu_serve}
source "$(dirname "$0")/gpu_common.sh"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}     # scripts/*.py import roseplay from here
MODEL=${MODEL:-dummy:qwen2.5-0.5b}; DEVICE=${DEVICE:-auto}
NUM_PROMPTS=${NUM_PROMPTS:-256}; INPUT_LEN=${INPUT_LEN:-512}; OUTPUT_LEN=${OUTPUT_LEN:-128}
WARMUP=${WARMUP:-16}; REPEAT=${REPEAT:-5}; NUM_CLIENTS=${NUM_CLIENTS:-6}
CLOSED_PROMPTS=${CLOSED_PROMPTS:-1024}; CLOSED_INFLIGHT=${CLOSED_INFLIGHT:-256}
PORT=${PORT:-18731}; SERVER_START_S=${SERVER_START_S:-300}; API_SERVERS=${API_SERVERS:-8}
ENG="--model $MODEL --device $DEVICE --max-num-batched-tokens 8192 --max-num-seqs 256"
W1="--scenario random --num-prompts $NUM_PROMPTS --input-len $INPUT_LEN --output-len $OUTPUT_LEN --warmup $WARMUP --no-progress"
CLOSED="--scenario random --num-prompts $CLOSED_PROMPTS --max-concurrency $CLOSED_INFLIGHT --input-len $INPUT_LEN --output-len $OUTPUT_LEN --warmup $WARMUP --no-progress"
URL=http://127.0.0.1:$PORT
BUDGET_S=${BUDGET_S:-480}; T_END=$((SECONDS + BUDGET_S))
lim() { local left=$((T_END - SECONDS - 15)); [ $left -lt 5 ] && left=5; [ $1 -lt $left ] && echo $1 || echo $left; }
SPY=${SPY:-$(command -v py-spy || ls /tmp/site/bin/py-spy 2>/dev/null || true)}

skip() { case " ${SKIP:-} " in *" $1 "*) return 0;; esac; return 1; }

skip ceiling || step ceiling $(lim 120) python3 scripts/client_ceiling.py --num-prompts 256 --output-len 128 \
  --num-clients 1 $NUM_CLIENTS --server-workers $NUM_CLIENTS --repeat 3 --json "$OUT/ceiling.json"
step direct_w1 $(lim 200) python3 -m roseplay bench $ENG $W1 --repeat $REPEAT --json "$OUT/direct_w1.json"
skip closed || step direct_closed $(lim 200) python3 -m roseplay bench $ENG $CLOSED --repeat $REPEAT --json "$OUT/direct_closed.json"

# the server in its own process group: whatever happens, the group (server + engine) goes
setsid python3 -m roseplay serve $ENG --port $PORT --api-server-count $API_SERVERS \
  --log-level warning > "$OUT/serve.log" 2>&1 &
SERVER=$!
stop_server() {
  kill -INT -- -$SERVER 2>/dev/null
  for _ in $(seq 20); do kill -0 $SERVER 2>/dev/null || break; sleep 0.5; done
  kill -9 -- -$SERVER 2>/dev/null; wait $SERVER 2>/dev/null
}
trap stop_server EXIT
server_failed() {
  echo "== server did not start" | tee -a "$SUMMARY"; tail -20 "$OUT/serve.log"
  python3 scripts/serve_perf_summary.py "$OUT" | tee "$OUT/summary.md"; exit 1
}
python3 - "$URL" "$(lim $SERVER_START_S)" $SERVER <<'PY' || server_failed
import os, sys, time, urllib.request
url, limit, pid = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
deadline = time.monotonic() + limit
while time.monotonic() < deadline:
    try:
        urllib.request.urlopen(url + "/health", timeout=2); sys.exit(0)
    except OSError:
        if not os.path.exists(f"/proc/{pid}"): sys.exit(1)
        time.sleep(0.5)
sys.exit(1)
PY
echo "== server up" | tee -a "$SUMMARY"
cpu() { for p in $SERVER $(cat /proc/$SERVER/task/*/children 2>/dev/null); do awk -v p=$p '{printf "%s %.2f ", p, ($14+$15)/100}' /proc/$p/stat; done; }
for p in $SERVER $(cat /proc/$SERVER/task/*/children 2>/dev/null); do    # which pid is what
  echo "$p $(tr '\0' ' ' < /proc/$p/cmdline | cut -c1-80)"; done > "$OUT/server_pids.txt"
echo "before $(date +%s.%N) $(cpu)" > "$OUT/server_cpu.txt"
step http_w1 $(lim 200) python3 -m roseplay bench --base-url $URL --model $MODEL $W1 --repeat $REPEAT \
  --num-clients $NUM_CLIENTS --json "$OUT/http_w1.json"
echo "after $(date +%s.%N) $(cpu)" >> "$OUT/server_cpu.txt"
skip closed || step http_closed $(lim 200) python3 -m roseplay bench --base-url $URL --model $MODEL $CLOSED --repeat $REPEAT \
  --num-clients $NUM_CLIENTS --json "$OUT/http_closed.json"
skip one_client || step http_w1_one_client $(lim 200) python3 -m roseplay bench --base-url $URL --model $MODEL $W1 \
  --repeat $REPEAT --num-clients 1 --json "$OUT/http_w1_one_client.json"
if [ -n "$SPY" ] && ! skip spy; then    # last, on runs of their own: sampling must not touch the figures above
  timeout 60 "$SPY" record --nonblocking -p $SERVER -r 200 -d 15 -f raw -o "$OUT/server_spy.txt" \
    > "$OUT/spy.log" 2>&1 &
  SPY_PID=$!
  step http_w1_profiled $(lim 60) python3 -m roseplay bench --base-url $URL --model $MODEL $W1 \
    --repeat 3 --num-clients $NUM_CLIENTS
  wait $SPY_PID
fi
stop_server
trap - EXIT
if [ "${ADMISSION:-0}" = 1 ]; then     # after the server is gone: a server of its own each
  for h in httptools h11; do
    step admission_$h $(lim 90) python3 scripts/admission_cost.py --model dummy:tiny \
      --requests 256 --rounds 5 --json "$OUT/admission_$h.json" --serve-args --http $h
  done
fi
python3 scripts/serve_perf_summary.py "$OUT" | tee "$OUT/summary.md"
