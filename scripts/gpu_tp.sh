#!/usr/bin/env bash
# One nvidia-h200-x2 call: TP=2 vs TP=1 greedy equality (float32, GPU), then bf16
# dummy:llama-3.1-8b batch-1 TPOT and W1-style throughput at TP=1 and TP=2 (medians of
# 3 runs each in one process), and the all-reduce cost of one decode step.
set -u
OUT=${OUT:-gpu_tp}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi -L; date -u; grep -m1 "model name" /proc/cpuinfo; nproc
ROSEPLAY_TEST_DEVICE=cuda timeout 240 python3 -m pytest tests/test_tp_engine.py -q -p no:cacheprovider -x -k greedy 2>&1 | tail -3
timeout 120 python3 scripts/allreduce_cost.py --hidden 4096 --layers 32 --batch 1,64,256 2>&1 | tail -3 | tee $OUT/allreduce.log
B="python3 -m roseplay.bench --no-progress --in-process --model dummy:llama-3.1-8b --repeat 3"
for tp in 1 2; do
  echo "== batch 1, TP=$tp"; timeout 200 $B --num-prompts 1 --input-len 512 --output-len 128 --warmup 2 --tensor-parallel-size $tp > $OUT/b1_tp$tp.log 2>&1; grep -E "Median TPOT|^runs|^output throughput" $OUT/b1_tp$tp.log
  echo "== W1, TP=$tp"; timeout 300 $B --num-prompts 256 --input-len 512 --output-len 128 --max-num-batched-tokens 8192 --max-num-seqs 256 --warmup 16 --tensor-parallel-size $tp > $OUT/w1_tp$tp.log 2>&1; grep -E "Median TPOT|^runs|^output throughput" $OUT/w1_tp$tp.log
done
