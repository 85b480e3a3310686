"""Verifier-protocol adapter around Medusa's typical acceptance (``medusa.model.utils.evaluate_posterior``).

Medusa (Cai et al. 2024, arXiv 2401.10774; PyPI package ``medusa-llm``) verifies a tree
of candidate continuations with *typical acceptance*: a candidate token x is accepted iff
``p(x) > min(posterior_threshold, posterior_alpha * exp(-H(p)))`` with
``H(p) = -sum p log(p + 1e-5)``, the longest accepted prefix wins (ties by likelihood).
It is lossy by design; this adapter lets :func:`specverify.measure.chain.measure_divergence`
measure how far, and check it against the exact law it declares
(:func:`reference.lossy.typical_declared_law`).

Layout (read from ``medusa/model/utils.py`` of ``medusa-llm`` 0.1)::

    evaluate_posterior(logits (C, L+1, V), candidates (C, L+1) long, temperature,
                       posterior_threshold, posterior_alpha) -> (best_candidate (), accept_length ())

``candidates[c, 0]`` is the token already chosen (the root), ``candidates[c, 1:]`` the
proposals of path c, and ``logits[c, j]`` the target's logits after ``candidates[c, :j+1]``,
so ``softmax(logits[:, :-1] / temperature)`` judges ``candidates[:, 1:]``.  A chain is one
path (C = 1), the smallest faithful layout: per protocol row, ``candidates = [root, x_1..x_K]``
(the root's value is never read; 0 here) and ``logits[0, j] = temperature * log
target_probs[b, j]`` for j = 0..K, so Medusa's ``softmax(logits / temperature)`` gives back
the harness' (already processed) target law.  Dim 0 of ``evaluate_posterior`` is the
candidate paths of *one* sequence (it takes the max over them), so rows are verified one at
a time.

After the accepted prefix ``x_1..x_n`` one more token comes from row n of the target
(``next_token``):

* ``"typical"`` -- a draw from p truncated to ``p >= threshold`` (same threshold formula),
  as ``get_typical_one_token`` of the later Medusa sources; the declared law is then exactly
  ``reference.lossy.typical_declared_law(..., entropy_offset=1e-5)``;
* ``"greedy"`` -- ``argmax p``, what ``generate_candidates`` of ``medusa-llm`` 0.1 does
  (``torch.argmax(logits[:, -1])``); declared law :func:`greedy_declared_law`.

The tree path (several candidate paths, longest accepted prefix, ties by likelihood) is
:class:`specverify.adapters.medusa.tree.MedusaTreeVerifier`, also reachable here as
``specverify.adapters.medusa:MedusaTreeVerifier`` and ``:typical_tree_verifier``.

Both ``next_token`` rules are this adapter's code (``medusa-llm`` 0.1 has no
``get_typical_one_token``); the code under test is ``evaluate_posterior``.

Install (its pinned dependencies are old; only ``torch`` is needed for ``medusa.model.utils``)::

    pip install --no-deps medusa-llm

The module imports ``medusa`` only when a verifier is built; without it construction
raises :class:`ImportError` naming that line.
"""

from __future__ import annotations

import torch

from specverify.adapters.runtime import torch_threads
from specverify.core.chain_laws import typical_threshold
from specverify.core.errors import ImplementationError, InvalidArgument
from specverify.core.sampling import sample
from specverify.core.validation import check_float, check_generator, check_int
from specverify_reference.lossy import typical_declared_law
from specverify_reference.rules import check_verifier_inputs

__all__ = [
    "MedusaTypicalVerifier",
    "typical_verifier",
    "greedy_declared_law",
    "next_tokens",
    "ENTROPY_OFFSET",
    "INSTALL",
]

#: Medusa computes the entropy as ``-sum p log(p + 1e-5)``.
ENTROPY_OFFSET = 1e-5
INSTALL = "pip install --no-deps medusa-llm==0.1"
NEXT_TOKEN = ("typical", "greedy")


def _load_evaluate_posterior():
    try:
        from medusa.model.utils import evaluate_posterior
    except ImportError as exc:
        raise ImportError(f"specverify.adapters.medusa needs the medusa-llm package: {INSTALL}") from exc
    return evaluate_posterior


def _float_dtype(dtype) -> torch.dtype:
    resolved = getattr(torch, str(dtype).removeprefix("torch."), None) if isinstance(dtype, str) else dtype
    if not isinstance(resolved, torch.dtype) or not resolved.is_floating_point:
        raise InvalidArgument(f"dtype must be a floating torch dtype or its name, got {dtype!r}")
    return resolved


def greedy_declared_law(target_probs, draft_probs=None, *, posterior_threshold=0.09, posterior_alpha=0.3):
    """Law of one position with a greedy next token: ``q 1[p > thr] + P_q(p <= thr) onehot(argmax p)``; (..., V).

    ``draft_probs=None`` (the bonus position): ``onehot(argmax p)``.
    """
    p = target_probs.to(torch.float64)
    p = p / p.sum(-1, keepdim=True)  # (..., V)
    greedy = torch.zeros_like(p).scatter_(-1, p.argmax(-1, keepdim=True), 1.0)  # (..., V)
    if draft_probs is None:
        return greedy
    q = draft_probs.to(torch.float64)
    q = q / q.sum(-1, keepdim=True)  # (..., V)
    thr = typical_threshold(p, eps=posterior_threshold, delta=posterior_alpha, entropy_offset=ENTROPY_OFFSET)
    accepted = q * (p > thr[..., None])  # (..., V)
    return accepted + (1.0 - accepted.sum(-1, keepdim=True)) * greedy


def next_tokens(rows, next_token: str, posterior_threshold: float, posterior_alpha: float, generator):
    """The token after the accepted prefix, one per row of ``rows`` (B, V): (B,) long.

    ``"greedy"``: ``argmax p``; ``"typical"``: a draw (one uniform per row from ``generator``)
    from p truncated to ``p >= min(posterior_threshold, posterior_alpha exp(-H(p)))``.
    Shared by the chain and the tree adapter (:mod:`specverify.adapters.medusa.tree`).
    """
    rows = rows.double()  # (B, V)
    if next_token == "greedy":
        return rows.argmax(-1)
    thr = typical_threshold(rows, eps=posterior_threshold, delta=posterior_alpha, entropy_offset=ENTROPY_OFFSET)  # (B,)
    return sample(torch.where(rows >= thr[:, None], rows, 0.0), generator=generator)


def typical_options(posterior_threshold, posterior_alpha, temperature, next_token, dtype, num_threads) -> dict:
    """The checked options shared by the chain and tree adapters (attribute name -> value)."""
    if next_token not in NEXT_TOKEN:
        raise InvalidArgument(f"next_token must be one of {NEXT_TOKEN}, got {next_token!r}")
    return {
        "posterior_threshold": check_float(
            "posterior_threshold", posterior_threshold, minimum=0.0, exclusive_minimum=True
        ),
        "posterior_alpha": check_float("posterior_alpha", posterior_alpha, minimum=0.0, exclusive_minimum=True),
        "temperature": check_float("temperature", temperature, minimum=0.0, exclusive_minimum=True),
        "next_token": next_token,
        "dtype": _float_dtype(dtype),
        "num_threads": None if num_threads is None else check_int("num_threads", num_threads, minimum=1),
    }


class MedusaTypicalVerifier:
    """``medusa.model.utils.evaluate_posterior`` on a one-path tree, behind the chain verifier protocol.

    Parameters
    ----------
    posterior_threshold : float > 0, default 0.09
        Medusa's epsilon (the hard threshold).
    posterior_alpha : float > 0, default 0.3
        Medusa's delta (scales ``exp(-H(p))``).
    temperature : float > 0, default 1.0
        Passed to ``evaluate_posterior``; logits are ``temperature * log p`` so that the
        target law is unchanged (temperature 0, Medusa's greedy branch, is not a sampling rule).
    next_token : {"typical", "greedy"}
        The token after the accepted prefix (see the module docstring).
    dtype : torch dtype or its name, default "float32"
        Dtype of the logits handed to Medusa.
    num_threads : int or None, default 1
        torch intra-op threads during the row loop (restored afterwards).

    Attributes
    ----------
    declared_law : callable
        ``declared_law(target_rows, draft_rows or None) -> (n, V)``, the law the rule declares.
    """

    def __init__(
        self,
        *,
        posterior_threshold: float = 0.09,
        posterior_alpha: float = 0.3,
        temperature: float = 1.0,
        next_token: str = "typical",
        dtype="float32",
        num_threads: int | None = 1,
    ):
        vars(self).update(
            typical_options(posterior_threshold, posterior_alpha, temperature, next_token, dtype, num_threads)
        )
        self._evaluate_posterior = _load_evaluate_posterior()

    def __repr__(self) -> str:
        return (
            f"MedusaTypicalVerifier(posterior_threshold={self.posterior_threshold:g}, "
            f"posterior_alpha={self.posterior_alpha:g}, temperature={self.temperature:g}, "
            f"next_token={self.next_token!r}, dtype={self.dtype})"
        )

    def declared_law(self, target_probs, draft_probs=None):
        """The law this configuration declares at one position (``draft_probs=None``: after K acceptances)."""
        options = dict(posterior_threshold=self.posterior_threshold, posterior_alpha=self.posterior_alpha)
        if self.next_token == "greedy":
            return greedy_declared_law(target_probs, draft_probs, **options)
        return typical_declared_law(
            target_probs, draft_probs, eps=options["posterior_threshold"], delta=options["posterior_alpha"],
            entropy_offset=ENTROPY_OFFSET,
        )  # fmt: skip

    def _accept_length(self, row: int, logits: torch.Tensor, candidates: torch.Tensor, K: int) -> int:
        try:
            best, length = self._evaluate_posterior(
                logits, candidates, self.temperature, self.posterior_threshold, self.posterior_alpha
            )
            best, length = int(best), int(length)
        except Exception as exc:  # the implementation under test failed
            raise ImplementationError(
                f"medusa evaluate_posterior raised on row {row}: {type(exc).__name__}: {exc}", row=row
            ) from exc
        if best != 0 or not 0 <= length <= K:
            raise ImplementationError(
                f"medusa evaluate_posterior returned best_candidate={best}, accept_length={length} on row {row} "
                f"for one path of {K} proposals (expected 0 and 0..{K})",
                row=row,
            )
        return length

    def verify(self, target_probs, draft_probs, draft_tokens, *, generator: torch.Generator):
        """Verify each row with ``evaluate_posterior``; see the module docstring.

        Returns
        -------
        tokens : Tensor (B, K+1) long
            Accepted proposals, then the next token; entries past ``num_emitted`` are 0.
        num_emitted : Tensor (B,) long
        """
        B, K, V = check_verifier_inputs(target_probs, draft_probs, draft_tokens)
        check_generator("generator", generator)
        device = target_probs.device
        logits = target_probs.to(self.dtype).log() * self.temperature  # (B, K+1, V)
        root = torch.zeros((B, 1), dtype=torch.long, device=device)  # (B, 1) never read by evaluate_posterior
        candidates = torch.cat([root, draft_tokens.long()], 1)  # (B, K+1)
        lengths = torch.empty(B, dtype=torch.long)  # (B,)
        with torch_threads(self.num_threads), torch.no_grad():
            for b in range(B):
                lengths[b] = self._accept_length(b, logits[b : b + 1], candidates[b : b + 1], K)
        lengths = lengths.to(device)
        rows = target_probs[torch.arange(B, device=device), lengths]  # (B, V) law after the prefix
        last = next_tokens(rows, self.next_token, self.posterior_threshold, self.posterior_alpha, generator)  # (B,)
        tokens = torch.cat([draft_tokens.long(), torch.zeros_like(root)], 1)  # (B, K+1)
        tokens = torch.where(torch.arange(K + 1, device=device)[None] < lengths[:, None], tokens, 0)
        tokens.scatter_(1, lengths[:, None], last[:, None])
        return tokens, lengths + 1

    __call__ = verify


def typical_verifier(
    *,
    posterior_threshold: float = 0.09,
    posterior_alpha: float = 0.3,
    temperature: float = 1.0,
    next_token: str = "typical",
    dtype="float32",
    num_threads: int | None = 1,
) -> MedusaTypicalVerifier:
    """Factory for ``--verifier specverify.adapters.medusa:typical_verifier`` (options as keywords)."""
    return MedusaTypicalVerifier(
        posterior_threshold=posterior_threshold,
        posterior_alpha=posterior_alpha,
        temperature=temperature,
        next_token=next_token,
        dtype=dtype,
        num_threads=num_threads,
    )


#: Names served by :mod:`specverify.adapters.medusa.tree` (imported on first use: it imports this module).
