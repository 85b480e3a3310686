"""Drafter mutants: drafters whose reported q is not the law they sample from.

The drafter rows of ``docs/bugs.md``, plus three of specverify's own, each built
as a wrapper around a table drafter (:mod:`specverify.core.tables`) so that both the
sampled and the reported law are known exactly:

=========================  ==============================================  ===================================
name                       samples from / reports                          provenance
=========================  ==============================================  ===================================
raw_q_processed_sample     top-k + temperature processed logits /          transformers #47932 / PR #47961
                           softmax of the raw logits
greedy_sample_soft_q       argmax / softmax of the logits                  transformers #32867, dflash #74,
                                                                           jaymody/speculative-sampling #3
precision_mismatch         softmax of bf16-rounded logits /                deepseek-ai/DeepSpec #31
                           fp32 softmax (logits of magnitude ~ 100,
                           where the bf16 spacing is 0.5)
processed_q_raw_sample     raw logits / top-k processed softmax            specverify (the mirror of #47932:
                           (drafted tokens outside the top-k have          processors applied to the reported
                           reported q = 0)                                 q only)
topp_unrenormalised        top-p truncated, renormalised / truncated       specverify (mask applied to probs
                           but not renormalised (rows sum to < 1)          after the softmax)
q_next_position            the row at its position / the row of the        specverify (off-by-one logits
                           *next* position (after the drafted token)       index, logits[:, i+1] for token i)
=========================  ==============================================  ===================================

``EQUIVALENTS`` are honest drafters that must pass: zoo drafters (oracle, uniform,
adversary, the deterministic one-hot drafters least_likely and argmax, stale) and
the fixed versions of two bugs above (processed logits sampled *and* reported;
bf16 logits sampled *and* reported).

Every factory takes the target :class:`~specverify.core.tables.TableModel` and returns a
drafter implementing ``draft(prefix (B, T), k, *, generator) -> (tokens (B, k),
probs (B, k, V))``.  The base drafter is the zoo's ``noisy`` drafter of the target
(full support, close to p) so that the pipeline still accepts drafts.

Shapes: B batch, T prefix tokens, k draft length, V vocabulary, C contexts.
"""

from __future__ import annotations

import torch

from specverify.core.errors import InvalidArgument
from specverify.core.sampling import sample
from specverify.core.tables import TableModel
from specverify.core.validation import check_generator, check_int, check_shape
from specverify.mutants.entry import CatalogueEntry
from specverify.verifier import zoo

__all__ = [
    "CATALOGUE",
    "ENTRIES",
    "EQUIVALENTS",
    "ReportedLawDrafter",
    "make_drafter_mutant",
    "top_k_mask",
    "top_p_mask",
]


class ReportedLawDrafter:
    """A table drafter that samples from ``sample_table`` and reports ``report_table``.

    Both tables are ``(C, V)`` over the context structure of ``base`` (a
    :class:`~specverify.core.tables.TableModel`).  With ``report_next=True`` the reported
    row of a draft is the row of the context *after* the drafted token (an off-by-one
    position).  ``report_table`` may hold unnormalised rows (reported as given).
    """

    def __init__(
        self,
        base: TableModel,
        sample_table: torch.Tensor,
        report_table: torch.Tensor,
        *,
        report_next: bool = False,
        name: str = "",
    ):
        if not isinstance(base, TableModel):
            raise InvalidArgument(f"base must be a specverify.core.tables.TableModel, got {type(base).__name__}")
        shape = tuple(base.table.shape)
        self.base = base
        self.sample_table = check_shape("sample_table", torch.as_tensor(sample_table, dtype=torch.float64), shape)
        self.report_table = check_shape("report_table", torch.as_tensor(report_table, dtype=torch.float64), shape)
        if bool((self.sample_table.sum(-1) <= 0).any()) or bool((self.sample_table < 0).any()):
            raise InvalidArgument("sample_table must have non-negative rows with a positive sum")
        self.report_next = bool(report_next)
        self.name = name or "reported_law"
        self.vocab_size = base.vocab_size

    def __repr__(self) -> str:
        return f"ReportedLawDrafter(name={self.name!r}, base={self.base!r})"

    def draft(self, prefix: torch.Tensor, k: int, *, generator: torch.Generator):
        """Drafter protocol: tokens (B, k) long drawn from ``sample_table``; probs (B, k, V) from ``report_table``."""
        prefix = check_shape("prefix", torch.as_tensor(prefix), (None, None))
        k = check_int("k", k, minimum=1)
        check_generator("generator", generator)
        lengths = torch.full((prefix.shape[0],), prefix.shape[1], dtype=torch.long)
        contexts = self.base.context_ids(prefix, lengths)  # (B,)
        tokens, probs = [], []
        for _ in range(k):
            token = sample(self.sample_table[contexts], generator=generator, check=False)  # (B,)
            following = self.base.next_context(contexts, token)  # (B,)
            probs.append(self.report_table[following if self.report_next else contexts])  # (B, V)
            tokens.append(token)
            contexts = following
        return torch.stack(tokens, 1), torch.stack(probs, 1)  # (B, k), (B, k, V)


# ---------------------------------------------------------------------- processors (float64, exact zeros)
def top_k_mask(probs: torch.Tensor, top_k: int) -> torch.Tensor:
    """Keep the ``top_k`` largest entries of each row (ties at the threshold kept), zero the rest; not renormalised."""
    threshold = probs.topk(min(top_k, probs.shape[-1]), -1).values[..., -1:]  # (..., 1)
    return torch.where(probs >= threshold, probs, torch.zeros_like(probs))


def top_p_mask(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest prefix (by descending probability) of mass >= ``top_p``; not renormalised."""
    sorted_probs, order = probs.sort(-1, descending=True)
    before = torch.cat([torch.zeros_like(sorted_probs[..., :1]), sorted_probs.cumsum(-1)[..., :-1]], -1)  # mass before
    keep = torch.zeros_like(before, dtype=torch.bool).scatter_(-1, order, before < top_p)
    return torch.where(keep, probs, torch.zeros_like(probs))


def _normalise(rows: torch.Tensor) -> torch.Tensor:
    return rows / rows.sum(-1, keepdim=True)


def _base(target: TableModel) -> TableModel:
    return zoo.noisy(target)


def _logits(table: torch.Tensor) -> torch.Tensor:
    return table.clamp_min(1e-300).log()


# ---------------------------------------------------------------------- mutant factories
def raw_q_processed_sample(target: TableModel, *, top_k: int = 3, temperature: float = 0.7) -> ReportedLawDrafter:
    """Samples softmax(top_k(logits) / T); reports softmax(logits)."""
    base = _base(target)
    processed = _normalise(top_k_mask(torch.softmax(_logits(base.table) / temperature, -1), top_k))
    return ReportedLawDrafter(base, processed, base.table, name="raw_q_processed_sample")


def greedy_sample_soft_q(target: TableModel) -> ReportedLawDrafter:
    """Samples argmax(logits) (a point mass); reports softmax(logits)."""
    base = _base(target)
    onehot = torch.nn.functional.one_hot(base.table.argmax(-1), base.vocab_size).to(torch.float64)  # (C, V)
    return ReportedLawDrafter(base, onehot, base.table, name="greedy_sample_soft_q")


def _bf16_pair(target: TableModel, offset: float):
    base = _base(target)
    logits32 = (_logits(base.table) + offset).to(torch.float32)  # (C, V) what the model computes
    fp32 = torch.softmax(logits32, -1).to(torch.float64)
    bf16 = torch.softmax(logits32.to(torch.bfloat16).to(torch.float64), -1)
    return base, _normalise(fp32), bf16


def precision_mismatch(target: TableModel, *, offset: float = 96.0) -> ReportedLawDrafter:
    """Samples softmax(bf16(logits)); reports the fp32 softmax.  Logits ~ ``offset`` (bf16 spacing 0.5 in [64, 128))."""
    base, fp32, bf16 = _bf16_pair(target, offset)
    return ReportedLawDrafter(base, bf16, fp32, name="precision_mismatch")


def processed_q_raw_sample(target: TableModel, *, top_k: int = 3) -> ReportedLawDrafter:
    """Samples softmax(logits); reports the top-k processed softmax (zero outside the top k)."""
    base = _base(target)
    return ReportedLawDrafter(
        base, base.table, _normalise(top_k_mask(base.table, top_k)), name="processed_q_raw_sample"
    )


def topp_unrenormalised(target: TableModel, *, top_p: float = 0.8) -> ReportedLawDrafter:
    """Samples the top-p truncated, renormalised q; reports the truncated q without renormalising."""
    base = _base(target)
    truncated = top_p_mask(base.table, top_p)
    return ReportedLawDrafter(base, _normalise(truncated), truncated, name="topp_unrenormalised")


def q_next_position(target: TableModel) -> ReportedLawDrafter:
    """Samples the row at its position; reports the row of the following position (off by one)."""
    base = _base(target)
    return ReportedLawDrafter(base, base.table, base.table, report_next=True, name="q_next_position")


# ---------------------------------------------------------------------- honest equivalents
def processed_consistent(target: TableModel, *, top_k: int = 3, temperature: float = 0.7) -> ReportedLawDrafter:
    """The fix of raw_q_processed_sample: the processed law is sampled and reported."""
    base = _base(target)
    processed = _normalise(top_k_mask(torch.softmax(_logits(base.table) / temperature, -1), top_k))
    return ReportedLawDrafter(base, processed, processed, name="processed_consistent")


def bf16_consistent(target: TableModel, *, offset: float = 96.0) -> ReportedLawDrafter:
    """The fix of precision_mismatch: the bf16 law is sampled and reported."""
    base, _, bf16 = _bf16_pair(target, offset)
    return ReportedLawDrafter(base, bf16, bf16, name="bf16_consistent")


def _entry(name, kind, factory, description, provenance, needs="", caught_by="") -> CatalogueEntry:
    """A drafter entry: ``factory(target: TableModel, **options) -> drafter``; ``caught_by`` names the test."""
    return CatalogueEntry(name, kind, factory, description, provenance, needs=needs, caught_by=caught_by)


# fmt: off
CATALOGUE: tuple[CatalogueEntry, ...] = (
    _entry("raw_q_processed_sample", "drafter", raw_q_processed_sample,
                 "samples from top-k (3) / temperature (0.7) processed logits, reports the softmax of the raw logits",
                 "transformers #47932 / PR #47961", "a drafter law with mass outside its top k", "consistency_gof"),
    _entry("greedy_sample_soft_q", "drafter", greedy_sample_soft_q,
                 "samples the argmax, reports the softmax of the logits",
                 "transformers #32867, dflash #74, jaymody/speculative-sampling #3", "a non-one-hot drafter law",
                 "consistency_gof"),
    _entry("precision_mismatch", "drafter", precision_mismatch,
                 "samples from bf16-rounded logits (magnitude ~96, bf16 spacing 0.5), reports the fp32 softmax",
                 "deepseek-ai/DeepSpec #31", "large logit magnitudes (bf16 spacing >= 0.25)", "consistency_gof"),
    _entry("processed_q_raw_sample", "drafter", processed_q_raw_sample,
                 "samples the raw softmax, reports the top-k (3) processed softmax: drafts outside the top k have q = 0",
                 "specverify (mirror of transformers #47932)", "a drafter law with mass outside its top k",
                 "consistency_support"),
    _entry("topp_unrenormalised", "drafter", topp_unrenormalised,
                 "samples the top-p (0.8) truncated, renormalised law, reports the truncated rows unrenormalised",
                 "specverify (top-p mask applied after the softmax)", "top-p truncation of a non-one-hot law",
                 "consistency_normalised"),
    _entry("q_next_position", "drafter", q_next_position,
                 "reports the row of the next position (after the drafted token) instead of its own",
                 "specverify (off-by-one logits index)", "a context-dependent drafter law", "consistency_gof"),
)
# fmt: on

# fmt: off
EQUIVALENTS: tuple[CatalogueEntry, ...] = (
    _entry("oracle", "drafter_equivalent", zoo.oracle, "q = p", "specverify zoo"),
    _entry("uniform", "drafter_equivalent", zoo.uniform, "uniform q", "specverify zoo"),
    _entry("adversary", "drafter_equivalent", zoo.adversary,
                 "(1 - eps) p + eps point mass on p's least likely token", "specverify zoo"),
    _entry("least_likely", "drafter_equivalent", zoo.least_likely,
                 "deterministic drafter, one-hot q on p's least likely token", "specverify zoo"),
    _entry("argmax", "drafter_equivalent", zoo.argmax,
                 "greedy drafter reporting its one-hot q honestly", "specverify zoo"),
    _entry("stale", "drafter_equivalent", zoo.stale, "q one token out of date (honest)", "specverify zoo"),
    _entry("processed_consistent", "drafter_equivalent", processed_consistent,
                 "top-k / temperature processed law sampled and reported", "the fix of transformers PR #47961"),
    _entry("bf16_consistent", "drafter_equivalent", bf16_consistent,
                 "bf16 logits sampled and their softmax reported", "the fix of deepseek-ai/DeepSpec #31"),
)
# fmt: on


ENTRIES: tuple[CatalogueEntry, ...] = CATALOGUE + EQUIVALENTS


def make_drafter_mutant(name: str, target: TableModel, **options):
    """Build the catalogued drafter ``name`` for ``target`` (options go to its factory)."""
    for entry in ENTRIES:
        if entry.name == name:
            return entry.build(target, **options)
    raise InvalidArgument(f"name must be one of {[e.name for e in ENTRIES]}, got {name!r}")
