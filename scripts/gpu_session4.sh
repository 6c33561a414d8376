#!/usr/bin/env bash
# One H100 call (session 4): the TUI's cost to the engine (alternating windows on one
# engine), W1 and batch 1 through the engine process (5 runs, host share), and the same
# workloads over HTTP through `roseplay serve` (bench --base-url, 5 runs each).
#   bash scripts/gpu_session4.sh      (wheels for zmq/msgspec/textual/fastapi... in .whl)
set -u
OUT=${OUT:-gpu_session4}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi -L; date -u; grep -m1 "model name" /proc/cpuinfo; nproc; git log --oneline -1 2>/dev/null
M=dummy:qwen2.5-0.5b
echo "== observer cost (alternating)"
timeout 240 python3 scripts/observer_cost.py --model $M --seconds 8 --warmup 10 --alternate 5 2>&1 | tee "$OUT/observer.log" | grep -v "^\s*$" | tail -13
W1="--scenario random --num-prompts 256 --input-len 512 --output-len 128 --warmup 16"
B1="--scenario random --num-prompts 1 --input-len 512 --output-len 128 --warmup 2"
ENG="--max-num-batched-tokens 8192 --max-num-seqs 256"
for wl in W1 B1; do
  echo "== $wl bench (engine process)"
  timeout 150 python3 -m roseplay bench --no-progress --repeat 5 --model $M $ENG ${!wl} > "$OUT/${wl}_direct.log" 2>&1
  grep -E "^runs|^output throughput|^median|^host share|Median TPOT|Median TTFT" "$OUT/${wl}_direct.log" | tail -6
done
python3 -m roseplay serve --model $M $ENG --port 18731 > "$OUT/serve.log" 2>&1 &
SERVER=$!
for i in $(seq 120); do python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:18731/health', timeout=2)" 2>/dev/null && break; sleep 1; done
echo "server up after ~${i}s"
for wl in W1 B1; do
  echo "== $wl bench --base-url (completions)"
  timeout 180 python3 -m roseplay bench --no-progress --repeat 5 --base-url http://127.0.0.1:18731 ${!wl} > "$OUT/${wl}_http.log" 2>&1
  grep -E "^runs|^output throughput|^median|Median TPOT|Median TTFT" "$OUT/${wl}_http.log" | tail -6
done
kill -INT $SERVER; sleep 3; kill -9 $SERVER 2>/dev/null
tail -3 "$OUT/serve.log"
