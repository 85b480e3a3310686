#!/usr/bin/env bash
# Download, here, the wheels the lent accelerator machine lacks for the kernel audits of run.sh:
# it reaches no package index, so they travel with the working tree (`carry`: .whl).
#   benchmarks/gpu/fetch_wheels.sh [DIR]      # default DIR: the repository's .whl/ (ignored by git)
# FlashInfer is a pure-Python wheel whose kernels are compiled on first use (nvcc and ninja are on
# the machine); of its dependencies only apache-tvm-ffi is missing there (cuDNN frontend and CUTLASS
# DSL are not imported by flashinfer.sampling).  Pinned: the versions checked to import beside the
# machine's packages.  vLLM's wheel (hundreds of MB, pinned to its own torch) cannot travel.
# Environment: PYVER (the machine's CPython, default 3.12), PYTHON (this machine's, default python3).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
dest="${1:-$repo/.whl}"
mkdir -p "$dest"
"${PYTHON:-python3}" -m pip download --no-deps --only-binary=:all: --python-version "${PYVER:-3.12}" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$dest" "flashinfer-python==0.6.0" "apache-tvm-ffi==0.1.15.post2"
du -sh "$dest"
