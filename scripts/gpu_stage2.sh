#!/usr/bin/env bash
# One device call: GPU engine tests, W1 and batch-1 in the new architecture (engine in its
# own process) and the old one (--in-process), 5 measured runs each in one process, and
# the HF peer baseline beside them. Needs the wheels of pyzmq/msgspec (/.whl, carried).
#   bash scripts/gpu_stage2.sh
set -u
OUT=${OUT:-gpu_stage2}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi -L; date -u; grep -m1 "model name" /proc/cpuinfo; nproc
python3 -m pytest tests/test_engine_gpu.py -q -p no:cacheprovider -x 2>&1 | tail -2
B="python3 -m roseplay.bench --no-progress --repeat 5"
W1="--num-prompts 256 --input-len 512 --output-len 128 --max-num-batched-tokens 8192 --max-num-seqs 256 --warmup 16"
B1="--num-prompts 1 --input-len 512 --output-len 128 --warmup 2"
for model in ${MODELS:-dummy:qwen2.5-0.5b}; do
  for wl in W1 B1; do
    for arch in "" "--in-process"; do
      echo "== $wl $model ${arch:-process}"
      $B --model $model ${!wl} $arch > "$OUT/${wl}_${model#dummy:}${arch}.log" 2>&1
      grep -E "^runs|^output throughput|median|Median TPOT|Median ITL" "$OUT/${wl}_${model#dummy:}${arch}.log" | head -4
    done
  done
done
if [ -f .dev/hf_peer_baseline.py ]; then python3 .dev/hf_peer_baseline.py 2>&1 | grep -E "^HF" | tee "$OUT/hf_peer.log"; fi
