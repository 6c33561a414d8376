#!/usr/bin/env bash
# One device call that produces every GPU number of docs/PERF.md (run from the repo root):
#   bash scripts/gpu_report.sh   (writes 8 files under $OUT, or ./gpu_report: the device
#   tool returns at most 8)
set -u
OUT=${OUT:-gpu_report}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
B="python3 -m roseplay.bench --no-progress"
W1="--num-prompts 256 --input-len 512 --output-len 128 --max-num-batched-tokens 8192 --max-num-seqs 256 --warmup 16"
B1="--num-prompts 1 --input-len 512 --output-len 128 --warmup 2"
nvidia-smi -L; date -u
python3 -m pytest tests/test_engine_gpu.py tests/test_kernels_gpu.py tests/test_kernels_gpu_linear.py -q -p no:cacheprovider 2>&1 | tail -3
$B --model dummy:qwen2.5-0.5b $W1 --compare hf --json $OUT/w1_qwen.json > $OUT/w1_qwen.log 2>&1
$B --model dummy:qwen2.5-0.5b $B1 > $OUT/b1_qwen.log 2>&1
$B --model dummy:llama-3.2-1b $W1 --json $OUT/w1_llama.json > $OUT/w1_llama.log 2>&1
$B --model dummy:llama-3.2-1b $B1 > $OUT/b1_llama.log 2>&1
for f in w1_qwen b1_qwen w1_llama b1_llama; do echo "== $f"; grep -E "Output token thr|Median TTFT|P99 TTFT|Median TPOT|Median ITL|P99 ITL|x[0-9.]+\)|ratio|agreement" $OUT/$f.log; done
Q="--model dummy:qwen2.5-0.5b"
{ $B $Q --scenario random --num-prompts 32 --input-len 16 --output-len 8 --max-num-batched-tokens 8192 --warmup 8 --ab max_num_seqs=64,1
  $B $Q --scenario long-short --num-prompts 64 --input-len 4096 --output-len 64 --submit-interval-ms 20 --max-num-seqs 8 --warmup 8 --ab max_num_batched_tokens=8192,224
  $B $Q --scenario identical --num-prompts 512 --input-len 65 --output-len 2 --max-num-seqs 512 --max-num-batched-tokens 8192 --warmup 8 --ab enable_prefix_caching=true,false
} > $OUT/design_notes.log 2>&1
grep -A14 "┏" $OUT/design_notes.log | head -80
python3 .dev/tools/hf_peer_baseline.py 2>&1 | grep -E "^HF" | tee $OUT/hf_peer.log
python3 scripts/profile_step.py --batches 1,16,64,256 --profile-batches ""   # step vs graph replay, ms
