#!/usr/bin/env bash
# Every GPU figure in one call of a lent GPU machine, so that its minutes go to measuring: the engine's
# correctness check against one full transformers forward (fp32, teacher-forced), the bench (engine
# against plain transformers, real 2B shape, random weights; grounding with and without zoom at 1080p
# and 4K), the per-phase profile and the batched serving figures (scripts/serve_bench.py), in that order,
# each within its share of 9.5 minutes. Results go to OUT (default out/gpu): one log and one JSON per
# step, and summary.txt saying how each step ended. STEPS picks steps (default "check bench profile"; the
# serving figures and start to ready cold and warm take a call of their own each: STEPS=serve or STEPS=starts).
# Every figure is taken with the newest GPU paths on, which are off by default until this check has
# passed them: QVL_FAST_BATCH=1 and QVL_FAST_PREFILL=1 unless set otherwise.
#
# Where the machine lacks the project's pinned packages, carry their wheels (.whl/) and run:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
#   PYTHONPATH=/tmp/site scripts/gpu_all.sh "$OUT"
# torch's compile cache is kept between calls as .bench/compile-cache.tar.gz (carry .bench) when small
# enough to come back.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-out/gpu}
mkdir -p "$out"
python=${PYTHON:-python3}
export QVL_FAST_BATCH=${QVL_FAST_BATCH:-1} QVL_FAST_PREFILL=${QVL_FAST_PREFILL:-1}
budget=570
start=$(date +%s)
cache="$HOME/.cache/qvl-agent/compile"
if [ -f .bench/compile-cache.tar.gz ]; then
  mkdir -p "$cache" && tar -xzf .bench/compile-cache.tar.gz -C "$cache"
fi

# step NAME SECONDS COMMAND...: run COMMAND for at most SECONDS (or what is left of the budget).
step() {
  local name=$1 share=$2 left
  shift 2
  left=$((budget - ($(date +%s) - start)))
  [ "$left" -lt "$share" ] && share=$left
  if [ "$share" -lt 30 ]; then
    echo "$name: not run, the budget was spent" >>"$out/summary.txt"
    return
  fi
  local t0=$(date +%s)
  timeout --signal=INT --kill-after=10 "$share" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc after $(($(date +%s) - t0)) s$([ $rc = 124 ] && echo ' (its share of the time ran out)')" >>"$out/summary.txt"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$out/summary.txt" 2>&1
steps=" ${STEPS:-check bench profile} "
want() { [[ $steps == *" $1 "* ]]; }
want check && step check 300 "$python" scripts/gpu_check.py --json "$out/check.json"
want bench && step bench 200 "$python" -m qvl_agent bench --device cuda --reps 5 --json "$out/bench.json"
want profile && step profile 70 "$python" scripts/profile_engine.py --device cuda --json "$out/profile.json"
want starts && step starts 540 "$python" -m qvl_agent bench --device cuda --reps 1 --start-times --json "$out/starts.json"
want serve && step serve 540 "$python" scripts/serve_bench.py --shape 2b --device cuda --clients 1,16,64 \
  --max-tokens 256 --max-batch 64,1 --check 4 --json "$out/serve.json"

archive="$out/compile-cache.tar.gz"
[ -d "$cache" ] && tar -czf "$archive" -C "$cache" . 2>/dev/null
[ -f "$archive" ] && [ "$(stat -c %s "$archive")" -gt $((15 << 20)) ] && rm -f "$archive"  # too large to come back
cat "$out/summary.txt"
