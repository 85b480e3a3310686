"""The same numbers on every CPU path: portable float64 functions, laws, orderings, float32 forwards.

The subprocess tests rerun a computation under the other CPU paths torch and numpy dispatch to
(``tests/cpu_paths.py``: AVX2, scalar) and compare it with this process's.  What they pin:

* the float64 laws of every verifier and tree scenario (targets and drafters) are equal to the
  bit on every path (``specverify.core.portable``);
* the ratio PIT's token order is the order of ``(q/p, token id)`` with one correctly rounded
  division per token, so exact ties stay ties and are broken by id;
* the reference decoder's tiny transformer: its default float64 forward gives the same tokens
  and laws within :data:`FORWARD64_LAW_RTOL` on every path; its float32 forward (as engines run
  theirs) gives laws within :data:`_results.FORWARD_LAW_RTOL`, and its tokens, equal on these
  samples, can flip on another CPU's BLAS (what made the float64 default necessary).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
from _results import FORWARD_LAW_RTOL, FORWARD_RTOL, TABLE_RTOL, tolerance_for
from cpu_paths import environment

from specverify.core import portable
from specverify.stats.directed import randomised_pit

ROOT = Path(__file__).resolve().parent.parent
OTHER_PATHS = ("avx2", "default")
#: How far the float64 forward's laws may move between CPU paths (relative): a few ulps of the
#: logits, amplified by 1/T in the softmax; 1e-12 leaves three orders of magnitude.
FORWARD64_LAW_RTOL = 1e-12


def _ulps(got: torch.Tensor, want: list[float]) -> float:
    ref = torch.tensor(want, dtype=torch.float64)
    ulp = torch.tensor([math.ulp(abs(v)) for v in want], dtype=torch.float64)
    return float(((got - ref).abs() / ulp).max())


def test_exp_and_log_are_within_two_ulps_of_the_c_library():
    gen = torch.Generator().manual_seed(11)
    x = torch.cat([torch.randn(20_000, generator=gen, dtype=torch.float64) * s for s in (1e-3, 1, 30, 300)])
    x = x.clamp(-708, 709)
    assert _ulps(portable.exp(x), [math.exp(v) for v in x.tolist()]) <= 1.0
    y = (
        torch.rand(50_000, generator=gen, dtype=torch.float64)
        * 10.0 ** torch.randint(-300, 300, (50_000,), generator=gen).double()
    )
    y = torch.cat([y[y > 0], torch.tensor([5e-324, 1e-310, 0.5, 1.0, 2.0, 1.0 + 2**-52], dtype=torch.float64)])
    want = [math.log(v) for v in y.tolist()]
    nonzero = torch.tensor(want, dtype=torch.float64) != 0
    assert _ulps(portable.log(y)[nonzero], [w for w in want if w != 0]) <= 2.0
    assert float(portable.log(torch.tensor([1.0], dtype=torch.float64))) == 0.0
    assert (
        _ulps(
            portable.power(torch.tensor([2.7, 10.0, 32768.0], dtype=torch.float64), -1.1),
            [2.7**-1.1, 10**-1.1, 32768**-1.1],
        )
        <= 4
    )


def test_special_values():
    e = portable.exp(torch.tensor([-math.inf, math.inf, math.nan, -800.0, 800.0, 0.0, 709.78], dtype=torch.float64))
    assert e[0] == 0 and e[1] == math.inf and math.isnan(e[2]) and e[3] == 0 and e[4] == math.inf and e[5] == 1
    assert math.isfinite(float(e[6]))
    lg = portable.log(torch.tensor([0.0, -1.0, math.inf, math.nan, 1.0], dtype=torch.float64))
    assert lg[0] == -math.inf and math.isnan(lg[1]) and lg[2] == math.inf and math.isnan(lg[3]) and lg[4] == 0
    rows = portable.softmax(torch.tensor([[0.0, -math.inf, 1.0], [-math.inf, -math.inf, 2.0]], dtype=torch.float64))
    assert rows[0, 1] == 0 and rows[1].tolist() == [0.0, 0.0, 1.0]
    assert torch.allclose(rows[0], torch.softmax(torch.tensor([0.0, -math.inf, 1.0], dtype=torch.float64), -1))
    assert portable.row_sums(torch.zeros(2, 0, dtype=torch.float64)).tolist() == [0.0, 0.0]


_LAWS = """
import hashlib, json, torch
from specverify.core import portable
from specverify.verifier.scenarios import get_scenarios
from specverify.verifier.tree.scenarios import get_tree_scenarios
out = {}
for s in get_scenarios():
    for role, m in zip(("target", "draft"), s.build()):
        out[f"{s.name}/{role}"] = hashlib.sha256(m.table.contiguous().numpy().tobytes()).hexdigest()
for s in get_tree_scenarios():
    for role, m in zip(("target", "draft"), s.build()):
        out[f"tree/{s.name}/{role}"] = hashlib.sha256(m.table.contiguous().numpy().tobytes()).hexdigest()
x = torch.arange(-40000, 40001, dtype=torch.float64) / 1000.0  # exact integers, one division: the same input everywhere
for f in (portable.exp, lambda v: portable.log(v.abs()), lambda v: portable.softmax(v.reshape(1, -1))):
    out[f"fn{len(out)}"] = hashlib.sha256(f(x).numpy().tobytes()).hexdigest()
print(json.dumps(out))
"""


def _run(code: str, path: str) -> str:
    env = {**os.environ, **environment(path)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_scenario_laws_are_bit_identical_on_every_cpu_path():
    here = json.loads(_run(_LAWS, "native"))
    assert len(here) > 40
    for path in OTHER_PATHS:
        there = json.loads(_run(_LAWS, path))
        differ = sorted(k for k in here if here[k] != there[k])
        assert not differ, f"{path}: laws differ from the native path's: {differ}"


def test_ratio_pit_orders_by_correctly_rounded_q_over_p_with_ties_by_id():
    """Rows built so that many q/p ratios tie exactly in real arithmetic (q = c p on a subset):
    F(x-) is the mass of the tokens before x in the order of (q/p rounded once, id)."""
    gen = torch.Generator().manual_seed(5)
    N, V = 64, 24
    target = portable.softmax(torch.randn(N, V, generator=gen, dtype=torch.float64) * 2).numpy()
    target[:, :6] = target[:, :1]  # exact ties in p
    target /= target.sum(1, keepdims=True)
    draft = target * 0.7
    draft[:, -3:] = 0.0
    draft[:, 0] += 1.0 - draft.sum(1)  # q/p = 0.7 in real arithmetic on most tokens
    tokens = np.array([int(torch.randint(V, (1,), generator=gen)) for _ in range(N)])
    pit = randomised_pit(target, tokens, generator=torch.Generator().manual_seed(1), order="ratio", draft_probs=draft)
    u = torch.rand((N,), generator=torch.Generator().manual_seed(1), dtype=torch.float64).numpy()
    for i in range(N):
        p, q, x = target[i] / target[i].sum(), draft[i] / draft[i].sum(), int(tokens[i])
        key = [(float(q[v]) / float(p[v]) if p[v] > 0 else math.inf, v) for v in range(V)]
        before = math.fsum(float(p[v]) for v in range(V) if key[v] < key[x])
        assert math.isclose(pit[i], min(before + u[i] * p[x], 1.0), rel_tol=1e-12, abs_tol=1e-15), i
    # in real arithmetic the ties are exact; rounding once per token keeps them tied whenever q/p rounds alike
    ratios = {Fraction(float(draft[0, v])) / Fraction(float(target[0, v])) for v in range(1, V - 3)}
    assert len(ratios) > 1  # the rows' float ratios are not all exactly 0.7: the order is decided by rounding


_FORWARD = """
import json, sys, torch, numpy as np
from specverify.cli.factories import reference_decoder, reference_target
from specverify.decoder.protocol import make_prompts
decoder = reference_decoder(temperature=0.8, top_k=20, dtype=DTYPE)
tokens = [decoder.generate(p, num_samples=500, max_new_tokens=8, seed=7) for p in make_prompts(2, 64, seed=0)]
target = reference_target(temperature=0.8, top_k=20, dtype=DTYPE)
prefixes = torch.randint(64, (128, 10), generator=torch.Generator().manual_seed(1))
laws = torch.stack([target.next_token_probs(prefixes[:, :n]).double() for n in range(1, 11)])
np.save(sys.argv[1], laws.numpy())
np.save(sys.argv[2], torch.stack(tokens).numpy())
"""


@pytest.mark.parametrize("dtype, law_rtol", [("float64", FORWARD64_LAW_RTOL), ("float32", FORWARD_LAW_RTOL)])
def test_model_forward_keeps_tokens_and_stays_within_the_stated_law_tolerance(tmp_path, dtype, law_rtol):
    """The reference decoder's transformer on the other CPU paths: the same tokens, laws within
    ``law_rtol`` relative (float32 measured 3.7e-5 at most on 3,072 prefixes, scalar vs AVX-512)."""
    runs = {}
    for path in ("native", *OTHER_PATHS):
        laws, tokens = tmp_path / f"{path}-laws.npy", tmp_path / f"{path}-tokens.npy"
        code = _FORWARD.replace("sys.argv[1]", repr(str(laws))).replace("sys.argv[2]", repr(str(tokens)))
        _run(code.replace("DTYPE", repr(dtype)), path)
        runs[path] = np.load(laws), np.load(tokens)
    laws0, tokens0 = runs["native"]
    for path in OTHER_PATHS:
        laws, tokens = runs[path]
        assert np.array_equal(tokens, tokens0), f"{path}: tokens differ"
        assert np.array_equal(laws > 0, laws0 > 0), f"{path}: supports differ"
        live = laws0 > 0
        rel = float((np.abs(laws - laws0)[live] / laws0[live]).max())
        assert rel <= law_rtol, f"{path}: {dtype} laws differ by {rel:.3g} relative"


def test_tolerance_follows_the_run():
    table = "specverify audit --verifier reference.rules:verify --tier smoke --seed 0"
    model = "specverify audit --decoder specverify.cli.factories:reference_decoder --target specverify.cli.factories:reference_target"
    drafter = (
        "specverify audit --drafter specverify.cli.factories:zoo_drafter --target specverify.cli.factories:table_target"
    )
    assert tolerance_for(table) == tolerance_for(drafter) == tolerance_for(model) == TABLE_RTOL == 1e-9
    float32 = model.replace("reference_target", "reference_target --target-option dtype=float32")
    engine = "specverify audit --decoder specverify.adapters.hf:tiny_assisted_decoder --decoder-option k=4"
    assert tolerance_for(float32) == tolerance_for(engine) == FORWARD_RTOL


@pytest.mark.parametrize("path", ["native", "avx2", "default", "tpu"])
def test_cpu_path_settings(path):
    if path == "tpu":
        with pytest.raises(ValueError, match="path"):
            environment(path)
        return
    env = environment(path)
    assert (path == "native") == (env == {})
    if env:
        assert env["ATEN_CPU_CAPABILITY"] == path
        proc = subprocess.run(
            [sys.executable, "-c", "import numpy, torch; print(torch.backends.cpu.get_cpu_capability())"],
            capture_output=True,
            text=True,
            env={**os.environ, **env},
            timeout=120,
        )
        assert proc.returncode == 0 and "CPU feature" not in proc.stderr, proc.stderr
        assert proc.stdout.strip() in ({"AVX2", "DEFAULT"} if path == "avx2" else {"DEFAULT"})
