"""The command line's malloc thresholds: large freed blocks are reused from the heap, not mapped afresh.

Each check runs in a fresh interpreter: the settings are process-wide, and the pytest process is
the user's kind of process, which the library never tunes.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys

import pytest

GLIBC = sys.platform.startswith("linux") and hasattr(ctypes.CDLL(None), "gnu_get_libc_version")

#: A child that mallocs a 64 MiB block (a (rows, V) block's size) twice and says where each one lies.
_WHERE = r"""
import ctypes, json, sys
if sys.argv[1] == "tuned":
    from specverify.core.allocator import reuse_large_blocks
    print(json.dumps({"set": reuse_large_blocks()}))
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)


def region(address):
    for line in open("/proc/self/maps"):
        parts = line.split()
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        if lo <= address < hi:
            return parts[5] if len(parts) > 5 else "anonymous"


where = []
for _ in range(2):
    block = libc.malloc(1 << 26)
    where.append([block, region(block)])
    libc.free(block)
print(json.dumps({"where": where}))
"""


def _child(mode: str, env: dict | None = None) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _WHERE, mode], capture_output=True, text=True, env=env or dict(os.environ), timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out: dict = {}
    for line in done.stdout.splitlines():
        out.update(json.loads(line))
    return out


@pytest.mark.skipif(not GLIBC, reason="glibc's mallopt only")
def test_the_command_lines_process_reuses_large_blocks():
    plain = _child("plain")
    tuned = _child("tuned")
    assert tuned["set"] is True
    # defaults: a 64 MiB block is a mapping of its own, made for it and unmapped when freed
    assert {r for _, r in plain["where"]} == {"anonymous"}, plain
    # raised thresholds: it comes from the heap, and the freed block is handed back as it is
    (first, r1), (second, r2) = tuned["where"]
    assert r1 == r2 == "[heap]" and first == second, tuned


@pytest.mark.skipif(not GLIBC, reason="glibc's mallopt only")
def test_a_users_own_glibc_settings_win():
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072")
    assert _child("tuned", env)["set"] is False


def test_the_console_script_is_the_tuned_entry_point():
    from importlib.metadata import entry_points

    scripts = {e.name: e.value for e in entry_points(group="console_scripts") if e.name == "specverify"}
    assert scripts == {"specverify": "specverify.cli:console_main"}
    from specverify.cli import console_main, main

    assert callable(console_main) and callable(main)


def test_an_endpoint_audit_keeps_the_default_allocator():
    """The endpoint client's heap would only grow (its threads' replies lie between the blocks it frees):
    every other command reuses large blocks, an endpoint audit does not."""
    from specverify.cli.commands import build_parser, reuses_large_blocks

    parser = build_parser()
    endpoint = parser.parse_args(["audit", "--endpoint", "http://127.0.0.1:1", "--model", "m"])
    decoder = parser.parse_args(["audit", "--decoder", "a:b", "--target", "c:d"])
    assert not reuses_large_blocks(endpoint)
    assert reuses_large_blocks(decoder)
    assert reuses_large_blocks(parser.parse_args(["selftest"]))
