#!/usr/bin/env bash
# The prepared accelerator check (issue 16): everything under $OUT, within 8 minutes on one GPU.
#   OUT=/path benchmarks/gpu/run.sh            # on a machine with CUDA (uses cuda:0)
#   OUT=/tmp/x benchmarks/gpu/run.sh --dry-run # same code paths on the CPU, tiny sizes (< 30 s; CI runs it)
# Options: --dry-run, --no-install (do not try to pip-install flashinfer-python / vllm), --device cuda:N.
# Environment: OUT (required), PYTHON (default: python, with torch for CUDA), BUDGET (seconds for the driver, default 330).
# Worst case: 2 x 45 s of pip + 330 s + 30 s grace = 450 s < 8 min.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"  # specverify and reference import without an install
: "${OUT:?set OUT to the output folder}"
PYTHON="${PYTHON:-python}"
BUDGET="${BUDGET:-330}"
dry=0; install=1; device="cuda:0"
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry=1 ;;
    --no-install) install=0 ;;
    --device) device="$2"; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$OUT"
start=$(date +%s)
{
  echo "# run.sh started $(date -u +%FT%TZ) dry_run=$dry device=$device"
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi > "$OUT/nvidia_smi.txt" 2>&1
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,power.limit,mig.mode.current \
      --format=csv > "$OUT/nvidia_smi.csv" 2>&1
  else
    echo "nvidia-smi not found" > "$OUT/nvidia_smi.txt"
  fi
  if [ "$dry" = 0 ] && [ "$install" = 1 ]; then
    # The kernel packages, if this machine can install them (45 s each at most; offline: they are skipped).
    for pkg in flashinfer-python vllm; do
      timeout 45 "$PYTHON" -m pip install --quiet "$pkg" > "$OUT/pip_$pkg.txt" 2>&1 \
        && echo "installed $pkg" || echo "could not install $pkg (see pip_$pkg.txt)"
    done
  fi
  args=(--out "$OUT" --device "$device" --budget "$BUDGET")
  [ "$dry" = 1 ] && args+=(--dry-run)
  timeout $((BUDGET + 30)) "$PYTHON" "$here/driver.py" "${args[@]}"
  rc=$?
  echo "$rc" > "$OUT/exit_code.txt"
  echo "# run.sh finished in $(( $(date +%s) - start )) s, driver exit $rc"
} 2>&1 | tee "$OUT/log.txt"
exit "$(cat "$OUT/exit_code.txt" 2>/dev/null || echo 1)"
