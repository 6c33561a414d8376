# Sourced by the scripts/gpu_*.sh runs (set OUT first): the device's missing wheels from
# .whl, the machine's facts, a summary file and step NAME SECONDS CMD... (a timeout, a
# log at $OUT/NAME.log, one summary line; a failing step is reported and the run goes on).
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi -L; date -u; grep -m1 "model name" /proc/cpuinfo; nproc; git log --oneline -1 2>/dev/null
SUMMARY="$OUT/summary.txt"; : > "$SUMMARY"

step() {
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout -k 10 "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "== $name rc=$? ($((SECONDS - t0)) s)" | tee -a "$SUMMARY"
  return 0
}
