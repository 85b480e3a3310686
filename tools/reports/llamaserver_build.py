"""Build llama.cpp's ``llama-server`` from a tagged source, into a virtualenv's ``bin``.

::

    python -m tools.reports.llamaserver_build [--venv .venvs/llama-server] [--jobs 2]

The source is the llama.cpp tree that ``llama-cpp-python`` 0.3.36 vendors (its sdist from PyPI,
``vendor/llama.cpp``, llama.cpp commit :data:`LLAMA_CPP_COMMIT`): a tagged release reachable
through the package index, so the build needs no access to GitHub.  It is configured for the CPU
(``Release``, static libraries, no web UI, no TLS, no tests or examples) and only the
``llama-server`` target is built, with CMake and Ninja (``pip install cmake ninja``) and the system's
C++17 compiler.  The binary lands in ``VENV/bin/llama-server``; the sdist and the build tree in
``build/llama-server`` (reused by a second run).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

__all__ = ["LLAMA_CPP_PYTHON", "LLAMA_CPP_COMMIT", "CMAKE_OPTIONS", "build", "main"]

#: The llama-cpp-python release whose sdist vendors the llama.cpp source built here.
LLAMA_CPP_PYTHON = "0.3.36"
#: The llama.cpp commit that release vendors (``git log -1`` in its ``vendor/llama.cpp``; 2026-10-01).
LLAMA_CPP_COMMIT = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
#: CMake options: a CPU build of the server alone.
CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
)


def _run(argv: list[str], log: Path) -> None:
    with log.open("a") as out:
        out.write("$ " + " ".join(argv) + "\n")
        out.flush()
        done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-20:])
        raise SystemExit(f"{argv[0]} failed (exit {done.returncode}); the end of {log}:\n{tail}")


def source(work: Path) -> Path:
    """The vendored llama.cpp tree of the sdist (downloaded and unpacked once)."""
    name = f"llama_cpp_python-{LLAMA_CPP_PYTHON}"
    tree = work / name / "vendor" / "llama.cpp"
    if (tree / "tools" / "server" / "CMakeLists.txt").exists():
        return tree
    work.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "pip", "download", f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "--no-binary", ":all:",
          "--no-deps", "-d", str(work)], work / "build.log")  # fmt: skip
    with tarfile.open(work / f"{name}.tar.gz") as archive:
        archive.extractall(work, filter="data")
    return tree


def build(venv: Path, *, jobs: int = 2, work: Path = Path("build/llama-server")) -> Path:
    """Build ``llama-server`` into ``venv/bin`` (see the module docstring); its path."""
    cmake = shutil.which("cmake")
    if cmake is None:
        raise SystemExit("cmake not found: pip install cmake ninja")
    tree = source(work)
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    out = work / "cmake"
    log = work / "build.log"
    _run([cmake, "-S", str(tree), "-B", str(out), *generator, *CMAKE_OPTIONS], log)
    _run([cmake, "--build", str(out), "--target", "llama-server", "-j", str(jobs)], log)
    target = venv / "bin" / "llama-server"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(out / "bin" / "llama-server", target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--venv", type=Path, default=Path(sys.prefix), help="where bin/llama-server goes "
                        "(default: the running Python's environment)")  # fmt: skip
    parser.add_argument("--jobs", type=int, default=2, help="parallel compile jobs (default 2)")
    parser.add_argument("--work", type=Path, default=Path("build/llama-server"), help="sdist and build tree")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    path = build(args.venv, jobs=args.jobs, work=args.work)
    print(f"built {path} (llama.cpp {LLAMA_CPP_COMMIT[:7]}) in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
