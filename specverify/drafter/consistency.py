"""Drafter consistency: do the drafter's samples follow the q it reports?

Speculative sampling is lossless for any drafter *provided the reported draft law q
is the law the tokens were drawn from*.  Real drafters have broken that promise
(``docs/bugs.md``: top-k/temperature applied to the sampling logits but not the
reported q, transformers #47932; greedy sampling with a softmax q, transformers
#32867; bf16 sampling logits with an fp32 q, DeepSpec #31).  This module checks it
directly, without a target and without a verifier.

For a fixed prefix, ``draft`` is called on the prefix repeated N times (in chunks,
one generator).  Draft position i of sample n was drawn, given its own drafted
prefix, from its own reported row ``q_i^(n)``.  Per position:

* ``consistency_gof``: token counts against the *sum* of the reported rows (a sum of
  independent multinomials: valid and conservative, see
  :func:`specverify.stats.gof_test`; exact at position 1 where all rows agree);
* ``consistency_pit``: the randomised PIT of every token under its own reported row
  (tokens ordered by q), Kolmogorov-Smirnov uniformity -- exact for any N;

and per prefix (all positions together):

* ``consistency_support``: a drafted token with reported q = 0 (exact: certain failure);
* ``consistency_normalised``: every reported row must sum to 1 (|sum - 1| <= 1e-4;
  a verifier fed an unnormalised q is not lossless).

All in family ``"consistency"``.  Malformed output (shapes, dtypes, out-of-vocabulary
tokens, NaN/negative rows) or different draws for the same generator seed raise
:class:`~specverify.core.errors.ImplementationError`.

References: Leviathan et al. (ICML 2023), Theorem 1 (losslessness needs x ~ q);
Czado, Gneiting & Held, Biometrics 65 (2009) (randomised PIT).

Shapes: N samples, K draft length, V vocabulary, T prefix tokens, b chunk rows.
"""

from __future__ import annotations

import torch

from specverify import stats
from specverify.core.errors import ImplementationError, raised
from specverify.core.results import TestResult
from specverify.decoder.pipeline import check_drafter_output

__all__ = [
    "draw_drafts",
    "check_drafter_determinism",
    "analyse_consistency",
    "consistency_summary",
    "NORMALISATION_ATOL",
    "DRAFT_CHUNK",
]

#: Tolerance on the row sums of a reported q.
NORMALISATION_ATOL = 1e-4
#: Rows per ``draft`` call.
DRAFT_CHUNK = 8192


def draw_drafts(
    drafter,
    prefix: torch.Tensor,
    *,
    num_samples: int,
    k: int,
    vocab_size: int,
    generator: torch.Generator,
    chunk: int = DRAFT_CHUNK,
):
    """``num_samples`` drafts of length k after ``prefix`` (T,): tokens (N, K) long, probs (N, K, V) float64."""
    tokens, probs = [], []
    for start in range(0, num_samples, chunk):
        b = min(chunk, num_samples - start)
        batch = prefix[None].expand(b, -1).clone()  # (b, T)
        try:
            output = drafter.draft(batch, k, generator=generator)
        except Exception as error:
            raise raised(f"drafter.draft(prefix {prefix.tolist()} x {b} rows, {k})", error) from error
        tok, pr = check_drafter_output(output, b, k, vocab_size)
        tokens.append(tok.cpu())
        probs.append(pr.detach().to("cpu", torch.float64))
    return torch.cat(tokens), torch.cat(probs)  # (N, K), (N, K, V)


def check_drafter_determinism(
    drafter, prefix: torch.Tensor, *, num_samples: int, k: int, vocab_size: int, seed: int
) -> None:
    """Two ``draft`` calls with generators of the same seed must agree; ImplementationError otherwise."""
    runs = [
        draw_drafts(
            drafter,
            prefix,
            num_samples=num_samples,
            k=k,
            vocab_size=vocab_size,
            generator=torch.Generator().manual_seed(seed),
        )
        for _ in range(2)
    ]
    (tok_a, probs_a), (tok_b, probs_b) = runs
    if not torch.equal(tok_a, tok_b) or not torch.equal(probs_a, probs_b):
        row = int(((tok_a != tok_b).any(1) | (probs_a != probs_b).flatten(1).any(1)).nonzero()[0])
        raise ImplementationError(
            f"drafter.draft is not deterministic: two calls with generators seeded {seed} differ "
            f"(prefix {prefix.tolist()}, row {row}: {tok_a[row].tolist()} vs {tok_b[row].tolist()})",
            row=row,
        )


def _support_result(tokens, probs, *, scenario: str) -> TestResult:
    q_x = probs.gather(-1, tokens[..., None]).squeeze(-1)  # (N, K)
    bad = q_x <= 0
    hits = int(bad.sum())
    details = {"violations": hits}
    if hits:
        rows, cols = bad.nonzero(as_tuple=True)
        details.update(
            tokens=sorted(set(tokens[rows, cols].tolist()))[:100],
            first_row=int(rows[0]),
            first_position=int(cols[0]) + 1,
            positions=sorted(set((cols + 1).tolist())),
        )
    return TestResult(
        statistic=float(hits),
        pvalue=0.0 if hits else 1.0,
        name="consistency_support",
        family="consistency",
        method="support: drafted tokens whose own reported q is exactly 0 (exact; any is a certain failure)",
        n=int(tokens.numel()),
        scenario=scenario,
        position="all",
        details=details,
    )


def _normalisation_result(probs, *, scenario: str) -> TestResult:
    sums = probs.sum(-1)  # (N, K)
    off = (sums - 1.0).abs()
    worst = float(off.max()) if off.numel() else 0.0
    bad = off > NORMALISATION_ATOL
    details = {
        "max_abs_deviation": worst,
        "rows_off": int(bad.sum()),
        "min_sum": float(sums.min()),
        "max_sum": float(sums.max()),
    }
    if bool(bad.any()):
        r, c = (int(i) for i in bad.nonzero()[0])
        details.update(first_row=r, first_position=c + 1, first_sum=float(sums[r, c]))
    return TestResult(
        statistic=worst,
        pvalue=0.0 if bool(bad.any()) else 1.0,
        name="consistency_normalised",
        family="consistency",
        method=f"reported q rows must sum to 1 within {NORMALISATION_ATOL:g} (exact; any row off is a certain failure)",
        n=int(sums.numel()),
        scenario=scenario,
        position="all",
        details=details,
    )


def analyse_consistency(
    tokens: torch.Tensor, probs: torch.Tensor, *, scenario: str, alpha: float, pit_generator: torch.Generator
) -> list[TestResult]:
    """The consistency tests of one prefix (see the module docstring); results are ungraded.

    Parameters
    ----------
    tokens : Tensor (N, K) long
        Drafted tokens.
    probs : Tensor (N, K, V) float64
        The rows the drafter reported for them.
    """
    N, K, V = probs.shape
    results = [_normalisation_result(probs, scenario=scenario), _support_result(tokens, probs, scenario=scenario)]
    sums = probs.sum(-1, keepdim=True)  # (N, K, 1)
    rows = torch.where(sums > 0, probs / sums.clamp_min(1e-300), torch.full_like(probs, 1.0 / V))  # (N, K, V)
    for i in range(K):
        label = dict(scenario=scenario, position=f"draft={i + 1}", family="consistency")
        x = tokens[:, i]  # (N,)
        counts = torch.bincount(x, minlength=V).numpy()
        expected = rows[:, i].sum(0).numpy()  # (V,) sum of the reported rows
        pooled = "; expected = sum of the reported rows (conservative past draft position 1)"
        for res in stats.gof_pair(counts, expected, alpha=alpha, name="consistency_gof", **label):
            results.append(res.replace(method=res.method + pooled))
        pit = stats.randomised_pit(rows[:, i].numpy(), x.numpy(), generator=pit_generator, order="p")
        results.append(stats.pit_test(pit, alpha=alpha, name="consistency_pit", **label))
    return results


def consistency_summary(tokens: torch.Tensor, probs: torch.Tensor) -> dict:
    """Observed vs reported frequencies of the most drafted tokens at draft position 1 (for the report)."""
    x = tokens[:, 0]
    N, _, V = probs.shape
    counts = torch.bincount(x, minlength=V).double()
    reported = probs[:, 0].sum(0)
    top = torch.argsort(-(counts + reported), stable=True)[: min(V, 8)]
    return {
        "position1_top_tokens": [
            {"token": int(t), "observed_freq": float(counts[t] / N), "reported_q": float(reported[t] / N)} for t in top
        ],
        "samples": int(N),
    }
