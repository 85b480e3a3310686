#!/usr/bin/env bash
# The prepared accelerator check (issue 16): everything under $OUT, within 6 minutes on one GPU (360 s at most).
#   OUT=/path benchmarks/gpu/run.sh            # on a machine with CUDA (uses cuda:0)
#   OUT=/tmp/x benchmarks/gpu/run.sh --dry-run # same code paths on the CPU, tiny sizes (< 30 s; CI runs it)
# Options:
#   --dry-run          the CPU, tiny sizes (wheels are still installed: the kernel adapters are probed)
#   --device cuda:N
#   --wheels DIR       install the wheels in DIR (no index, no dependencies) into a private folder first;
#                      default: the repository's .whl/ when it exists (benchmarks/gpu/fetch_wheels.sh fills it)
#   --pip-index        also try `pip install flashinfer-python` and `pip install vllm` from the package
#                      index, 45 s each (for a machine that can reach one; the lent machines cannot)
#   --keep-tree        leave the output tree as it is instead of packing it (below)
#   --no-install       install nothing (neither wheels nor the index)
# Environment: OUT (required), PYTHON (default: python, with torch for CUDA), BUDGET (seconds for the
# driver, default 200), TESTS (seconds for the suite's CUDA tests, default 100).
# Worst case without --pip-index: 100 s + 200 s + 60 s grace = 360 s.
# Before the driver, the test suite's CUDA tests run (pytest -m gpu, TESTS seconds at most).
# Output: by default the tree the driver writes is packed, so that a machine that returns only a few
# files gives back all of it: $OUT/gpu_check.tar.gz (the whole tree), $OUT/summary.json, $OUT/log.txt,
# $OUT/exit_code.txt.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
: "${OUT:?set OUT to the output folder}"
PYTHON="${PYTHON:-python}"
BUDGET="${BUDGET:-200}"
TESTS="${TESTS:-100}"
export PYTHONUNBUFFERED=1
dry=0; install=1; index=0; pack=1; device="cuda:0"; wheels=""
[ -d "$repo/.whl" ] && wheels="$repo/.whl"
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry=1 ;;
    --no-install) install=0 ;;
    --pip-index) index=1 ;;
    --keep-tree) pack=0 ;;
    --wheels) wheels="$2"; shift ;;
    --device) device="$2"; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
tree="$OUT/gpu_check"
mkdir -p "$tree"
site="$(mktemp -d)/site"  # carried wheels go here, after the repository on the path
export PYTHONPATH="$repo:$site${PYTHONPATH:+:$PYTHONPATH}"  # specverify and reference import without an install
start=$(date +%s)
{
  echo "# run.sh started $(date -u +%FT%TZ) dry_run=$dry device=$([ "$dry" = 1 ] && echo cpu || echo "$device")"
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi > "$tree/nvidia_smi.txt" 2>&1
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,power.limit,mig.mode.current \
      --format=csv > "$tree/nvidia_smi.csv" 2>&1
  else
    echo "nvidia-smi not found" > "$tree/nvidia_smi.txt"
  fi
  if [ "$install" = 1 ]; then
    if [ -n "$wheels" ] && ls "$wheels"/*.whl >/dev/null 2>&1; then
      # No index, no dependencies: the wheels are what the machine lacks, everything else is its own.
      "$PYTHON" -m pip install --quiet --no-index --no-deps --no-compile --target "$site" "$wheels"/*.whl \
        > "$tree/pip_wheels.txt" 2>&1 && echo "installed $(ls "$wheels" | tr '\n' ' ')" \
        || echo "could not install the wheels in $wheels (see pip_wheels.txt)"
    fi
    if [ "$index" = 1 ] && [ "$dry" = 0 ]; then
      for pkg in flashinfer-python vllm; do
        timeout 45 "$PYTHON" -m pip install --quiet "$pkg" > "$tree/pip_$pkg.txt" 2>&1 \
          && echo "installed $pkg" || echo "could not install $pkg (see pip_$pkg.txt)"
      done
    fi
  fi
  # The suite's own CUDA tests (pytest -m gpu; on the CPU they skip): results into the summary.
  # FlashInfer is left to the driver's kernel section: its first call compiles its kernels.
  (cd "$repo" && timeout "$TESTS" "$PYTHON" -m pytest -q -n0 -m gpu -k "not flashinfer" -p no:cacheprovider -rs --continue-on-collection-errors \
    --junitxml="$tree/gpu_tests.xml" tests) > "$tree/gpu_tests.txt" 2>&1
  echo "pytest -m gpu: exit $? ($(tail -n 1 "$tree/gpu_tests.txt"))"
  args=(--out "$tree" --device "$device" --budget "$BUDGET" --gpu-tests "$tree/gpu_tests.xml")
  [ "$dry" = 1 ] && args+=(--dry-run)
  timeout $((BUDGET + 60)) "$PYTHON" "$here/driver.py" "${args[@]}"
  rc=$?
  echo "$rc" > "$OUT/exit_code.txt"
  echo "# run.sh finished in $(( $(date +%s) - start )) s, driver exit $rc"
} 2>&1 | tee "$OUT/log.txt"
[ -f "$tree/summary.json" ] && cp "$tree/summary.json" "$OUT/summary.json"
cp "$OUT/log.txt" "$OUT/exit_code.txt" "$tree/" 2>/dev/null
if [ "$pack" = 1 ]; then
  tar -czf "$OUT/gpu_check.tar.gz" -C "$OUT" gpu_check && rm -rf "$tree"
fi
exit "$(cat "$OUT/exit_code.txt" 2>/dev/null || echo 1)"
