"""The distribution tests engines ship today ("peers"), re-implemented for comparison.

Each peer takes a verifier (the verifier protocol) and a seed and returns a
:class:`PeerResult`.  They are reproduced as published, weaknesses included (no
false-alarm control, no power statement, one fixed (p, q) pair), so that the mutation
matrix can show what each would have caught.  They are NOT statistical tests in the
suite's sense and nothing in specverify relies on them for a verdict.

(a) :func:`peer_vllm_l2_ratio` -- vLLM ``tests/samplers/test_rejection_sampler.py::
    test_rejection_sampling_approximates_target_distribution`` (V0 rejection sampler,
    vllm-project/vllm, e.g. v0.6.3): V = 10, K = 1, target and draft softmax(U[0,1)^V);
    for N in 10, 100, ..., 100000 the first emitted position's histogram is compared with
    the target and with 100 random reference laws by Euclidean distance; pass iff the
    distance to the target shrinks more than 20 times faster (first/last ratio) than the
    distance to the references.  Run for draft != target and draft == target.
(b) :func:`peer_chi2_10sigma` -- the chi-square "10 sigma" check of vLLM
    ``tests/v1/spec_decode/test_rejection_sampler_utils.py::_assert_distribution_match``
    (FlashInfer/SGLang-style kernels are tested the same way): V = 16, 200,000 trials,
    target softmax(N(0,1)^V), draft softmax(-target logits), the same (p, q) at every
    position, K in (1, 3); per position, counts of the rows that emit it, cells with
    expected < 5 merged into one "other" cell, fail iff Pearson > df + 10 sqrt(2 df).
(c) :func:`peer_tv_threshold` -- "TV < 0.008 on 65,536 samples" at the first emitted
    position, as described in the project brief (no public source located): V = 16,
    K = 4, target and draft softmax(N(0,1)^V) at every position.

:func:`peer_matrix` runs every peer on every catalogue entry.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from specverify.core.validation import check_int

__all__ = ["PeerResult", "peer_vllm_l2_ratio", "peer_chi2_10sigma", "peer_tv_threshold", "PEERS", "peer_matrix"]


@dataclass(frozen=True)
class PeerResult:
    """Outcome of one peer test run.

    Attributes
    ----------
    passed : bool
        The peer's own verdict (False also when the verifier raised or broke the protocol).
    samples : int
        Verifier rows (blocks) the peer consumed.
    seconds : float
        Wall-clock time of the run.
    details : Mapping
        The peer's statistics (distances, chi-square values and thresholds, TV) or ``error``.
    """

    passed: bool
    samples: int
    seconds: float
    details: Mapping = field(default_factory=dict)


class _ProtocolBroken(Exception):
    pass


def _run(verify: Callable, target, draft, tokens, generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Call the verifier and check the output's structure (a broken output fails the peer)."""
    B, K1, V = target.shape
    out, n = verify(target, draft, tokens, generator=generator)
    if not (isinstance(out, torch.Tensor) and isinstance(n, torch.Tensor)):
        raise _ProtocolBroken(f"verifier returned {type(out).__name__}, {type(n).__name__}")
    if tuple(out.shape) != (B, K1) or tuple(n.shape) != (B,):
        raise _ProtocolBroken(f"output shapes {tuple(out.shape)}, {tuple(n.shape)}; expected ({B}, {K1}), ({B},)")
    out, n = out.long(), n.long()
    valid = torch.arange(K1)[None] < n[:, None]  # (B, K+1)
    if bool(((out[:, 0] < 0) | (out[:, 0] >= V)).any()) or bool(((out < 0) | (out >= V))[valid].any()):
        raise _ProtocolBroken("out-of-vocabulary token")
    return out, n


def _timed(body: Callable[[], tuple[bool, int, dict]]) -> PeerResult:
    start = time.perf_counter()
    try:
        passed, samples, details = body()
    except Exception as exc:  # a verifier that raises fails the peer, as it fails the engine's test
        return PeerResult(False, 0, time.perf_counter() - start, {"error": f"{type(exc).__name__}: {exc}"})
    return PeerResult(bool(passed), int(samples), time.perf_counter() - start, details)


# ---------------------------------------------------------------- (a) vLLM L2 ratio

VLLM_SAMPLE_SIZES = (10, 100, 1_000, 10_000, 100_000)
VLLM_IMPROVEMENT_MULTIPLIER = 20


def peer_vllm_l2_ratio(verify: Callable, *, seed: int = 0) -> PeerResult:
    """vLLM's L2-distance-ratio test (see the module docstring, (a)).

    Pass iff, for draft != target and for draft == target,
    ``d_target(10) / d_target(100000) > 20 * d_ref(10) / d_ref(100000)`` where ``d_target``
    is the Euclidean distance of the first-position histogram to the target and ``d_ref``
    the norm of its differences to 100 random references divided by 100 (as
    ``torch.dist(reference_probs, hist) / 100`` computes).
    """
    seed = check_int("seed", seed, minimum=0)

    def body():
        g = torch.Generator().manual_seed(seed)
        V, K = 10, 1
        details, passed, samples = {}, True, 0
        for equal in (False, True):
            draft_law, target_law = (torch.softmax(torch.rand(V, generator=g), -1) for _ in range(2))
            reference = torch.softmax(torch.rand(100, V, generator=g), -1)  # (100, V)
            if equal:
                target_law = draft_law.clone()
            d_target, d_ref = [], []
            for n in VLLM_SAMPLE_SIZES:
                draft = draft_law.reshape(1, K, V).repeat(n, 1, 1)  # (N, K, V)
                target = target_law.reshape(1, 1, V).repeat(n, K + 1, 1)  # (N, K+1, V)
                tokens = torch.multinomial(draft[:, 0], 1, replacement=True, generator=g)  # (N, 1)
                out, _ = _run(verify, target, draft, tokens, g)
                hist = torch.bincount(out[:, 0], minlength=V).float() / n  # (V,) density, bin width 1
                d_target.append(torch.dist(target_law, hist).item())
                d_ref.append(torch.dist(reference, hist).item() / reference.shape[0])
                samples += n
            ratio_target = d_target[0] / d_target[-1] if d_target[-1] > 0 else math.inf
            ratio_ref = d_ref[0] / d_ref[-1]
            ok = ratio_target > ratio_ref * VLLM_IMPROVEMENT_MULTIPLIER
            passed = passed and ok
            details["equal" if equal else "distinct"] = {
                "distance_to_target": d_target,
                "distance_to_reference": d_ref,
                "target_ratio": ratio_target,
                "reference_ratio": ratio_ref,
                "passed": ok,
            }
        return passed, samples, details

    return _timed(body)


# ---------------------------------------------------------------- (b) chi-square, 10 sigma

CHI2_VOCAB = 16
CHI2_TRIALS = 200_000
CHI2_MIN_EXPECTED = 5.0
CHI2_K = (1, 3)


def _chi2_10sigma(tokens: torch.Tensor, target_law: torch.Tensor) -> dict:
    """Pearson statistic with cells of expected < 5 merged into one cell; threshold df + 10 sqrt(2 df)."""
    n = tokens.numel()
    observed = torch.bincount(tokens, minlength=target_law.numel()).double()
    expected = target_law.double() * n
    keep = expected >= CHI2_MIN_EXPECTED
    obs, exp = observed[keep], expected[keep]
    other_exp = expected[~keep].sum()
    if other_exp >= CHI2_MIN_EXPECTED:
        obs = torch.cat([obs, observed[~keep].sum()[None]])
        exp = torch.cat([exp, other_exp[None]])
    df = obs.numel() - 1
    if df < 1:
        return {"n": n, "df": df, "statistic": 0.0, "threshold": None, "passed": True}
    stat = float(((obs - exp) ** 2 / exp).sum())
    threshold = df + 10 * math.sqrt(2 * df)
    return {"n": n, "df": df, "statistic": stat, "threshold": threshold, "passed": stat < threshold}


def peer_chi2_10sigma(verify: Callable, *, seed: int = 0) -> PeerResult:
    """Per-position chi-square with the "10 sigma" threshold (see the module docstring, (b))."""
    seed = check_int("seed", seed, minimum=0)

    def body():
        g = torch.Generator().manual_seed(seed)
        V = CHI2_VOCAB
        logits = torch.randn(V, generator=g)
        target_law, draft_law = torch.softmax(logits, -1), torch.softmax(-logits, -1)
        details, passed, samples = {}, True, 0
        for K in CHI2_K:
            target = target_law.expand(CHI2_TRIALS, K + 1, V)  # (N, K+1, V)
            draft = draft_law.expand(CHI2_TRIALS, K, V)  # (N, K, V)
            tokens = torch.multinomial(draft_law.expand(CHI2_TRIALS, V), K, replacement=True, generator=g)  # (N, K)
            out, n = _run(verify, target, draft, tokens, g)
            per_position = []
            for pos in range(K + 1):
                emitted = n >= pos + 1
                per_position.append(_chi2_10sigma(out[emitted, pos], target_law))
            ok = all(r["passed"] for r in per_position)
            passed = passed and ok
            details[f"K={K}"] = {"positions": per_position, "passed": ok}
            samples += CHI2_TRIALS
        return passed, samples, details

    return _timed(body)


# ---------------------------------------------------------------- (c) TV threshold

TV_SAMPLES = 65_536
TV_THRESHOLD = 0.008
TV_VOCAB = 16
TV_K = 4


def peer_tv_threshold(verify: Callable, *, seed: int = 0) -> PeerResult:
    """Pass iff the first emitted position's empirical TV to p is < 0.008 over 65,536 rows.

    Under a correct verifier E[TV] ~ 0.5 sum_v sqrt(2 p_v (1 - p_v) / (pi N)), about 0.005
    here, so the threshold is a few standard deviations out; it is blind to every position
    after the first.
    """
    seed = check_int("seed", seed, minimum=0)

    def body():
        g = torch.Generator().manual_seed(seed)
        V, K, N = TV_VOCAB, TV_K, TV_SAMPLES
        target_law = torch.softmax(torch.randn(V, generator=g), -1)
        draft_law = torch.softmax(torch.randn(V, generator=g), -1)
        target = target_law.expand(N, K + 1, V)  # (N, K+1, V)
        draft = draft_law.expand(N, K, V)  # (N, K, V)
        tokens = torch.multinomial(draft_law.expand(N, V), K, replacement=True, generator=g)  # (N, K)
        out, _ = _run(verify, target, draft, tokens, g)
        hist = torch.bincount(out[:, 0], minlength=V).double() / N
        tv = 0.5 * float((hist - target_law.double()).abs().sum())
        return tv < TV_THRESHOLD, N, {"tv": tv, "threshold": TV_THRESHOLD, "n": N}

    return _timed(body)


PEERS: dict[str, Callable[..., PeerResult]] = {
    "vllm_l2_ratio": peer_vllm_l2_ratio,
    "chi2_10sigma": peer_chi2_10sigma,
    "tv_0.008": peer_tv_threshold,
}


def peer_matrix(catalogue, *, seed: int = 0, peers: Mapping[str, Callable] | None = None) -> list[dict]:
    """Run every peer on every catalogue entry.

    Parameters
    ----------
    catalogue : iterable of CatalogueEntry
        E.g. ``specverify.mutants.CATALOGUE``.
    seed : int
        Seed handed to every peer.
    peers : mapping name -> peer, optional
        Defaults to :data:`PEERS`.

    Returns
    -------
    list of dict
        One row per entry: ``name``, ``kind``, ``provenance``, ``needs``, ``requires``,
        ``results`` (peer name -> :class:`PeerResult`) and ``caught`` (peer name -> bool:
        the peer failed the entry; for an equivalent variant that is a false alarm).
    """
    seed = check_int("seed", seed, minimum=0)
    peers = dict(PEERS if peers is None else peers)
    rows = []
    for entry in catalogue:
        results = {name: peer(entry.fn, seed=seed) for name, peer in peers.items()}
        rows.append(
            {
                "name": entry.name,
                "kind": entry.kind,
                "provenance": entry.provenance,
                "needs": entry.needs,
                "requires": entry.requires,
                "results": results,
                "caught": {name: not r.passed for name, r in results.items()},
            }
        )
    return rows
