"""``specverify selftest``: the suite tests itself -- mutation score, false alarms, calibration.

``run_selftest(tier="smoke", seed=0, ...) -> SelftestResult`` runs

1. the verifier battery on every catalogued verifier mutant (it must FAIL) and every
   equivalent variant (it must PASS), on the scenarios of :mod:`.plan` in the smoke tier
   (the full battery in standard): verdict, the killing test (family / name / scenario /
   position, adjusted p), the samples needed (doubling schedule, :mod:`.verifiers`) and
   the time;
2. ``check_decoder`` on the decoder mutants, ``audit_drafter`` on the drafter mutants and
   honest drafters, and ``check_tree_verifier`` on the tree mutants and tree equivalents
   (:mod:`.battery_runs`; tree scenarios per entry in :mod:`.plan`);
3. a calibration run at alpha = 0.05 (:mod:`.calibration`);
4. optionally (``lr=True``; on with ``--matrix`` and in the standard tier) the
   likelihood-ratio limit per verifier mutant (:mod:`specverify.selftest.lr_limit`),
   and (``peers=True``, on with ``--matrix``) the three peer tests of
   :mod:`specverify.selftest.peers` on every verifier entry and every tree entry (as a
   one-path tree, :mod:`specverify.verifier.tree.chain`), for the Markdown matrix
   (:mod:`.render`).

``main(tier, seed, as_json, matrix_path) -> int`` is the CLI entry: exit status 1 if a
catalogued mutant survives or a correct variant fails, else 0.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

from specverify.core.errors import InvalidArgument
from specverify.core.validation import check_alpha, check_int
from specverify.verifier.scenarios import TIERS

from .battery_runs import run_decoder_mutants, run_drafter_mutants, run_tree_entries
from .calibration import run_calibration
from .parallel import Part, run_parts
from .render import render_json, render_markdown, render_text
from .verifiers import run_verifier_entry

__all__ = ["SelftestResult", "run_selftest", "main", "LR_ROWS", "ALPHA"]

ALPHA = 1e-3
#: Monte Carlo rows of the mutant per LR limit, per tier.
LR_ROWS = {"smoke": 1 << 16, "standard": 1 << 18, "deep": 1 << 20}


@dataclass(frozen=True)
class SelftestResult:
    """Outcome of a selftest run.

    Attributes
    ----------
    rows : tuple of dict
        One per entry (verifier mutants, equivalents, decoder and drafter entries).
    calibration : dict or None
    peers : tuple of dict or None
        :func:`specverify.selftest.peers.peer_matrix` rows (with ``results`` flattened to dicts).
    tier, seed, alpha : run parameters
    seconds : float
    notes : tuple of str
    environment : dict
    """

    rows: tuple
    calibration: dict | None
    peers: tuple | None
    tier: str
    seed: int
    alpha: float
    seconds: float
    notes: tuple = ()
    environment: dict = field(default_factory=dict)

    def _of(self, expected: str) -> list[dict]:
        return [r for r in self.rows if r["expected"] == expected]

    @property
    def survivors(self) -> list[dict]:
        return [r for r in self._of("fail") if not r["killed"]]

    @property
    def false_alarms(self) -> list[dict]:
        return [r for r in self._of("pass") if r["killed"]]

    @property
    def mutation_score(self) -> tuple[int, int]:
        mutants = self._of("fail")
        return sum(r["killed"] for r in mutants), len(mutants)

    @property
    def passed(self) -> bool:
        return not self.survivors and not self.false_alarms

    def to_dict(self) -> dict:
        killed, total = self.mutation_score
        return {
            "tier": self.tier,
            "seed": self.seed,
            "alpha": self.alpha,
            "seconds": self.seconds,
            "passed": self.passed,
            "mutation_score": {"killed": killed, "total": total},
            "survivors": [r["name"] for r in self.survivors],
            "false_alarms": [r["name"] for r in self.false_alarms],
            "rows": list(self.rows),
            "calibration": self.calibration,
            "peers": None if self.peers is None else list(self.peers),
            "notes": list(self.notes),
            "environment": self.environment,
        }


def _tree_entries_as_chains() -> tuple:
    """Tree entries as chain verifiers (one path per tree), for the peers' chain tests.

    Sibling rules run as mode "iid" (SpecInfer on one child = the canonical chain rule),
    target-only kernels (SGLang's coin rules, marked ``kernel.target_only``) as mode "any"
    (sample-and-match); kinds map to verifier/equivalent.
    """
    import dataclasses

    from specverify import mutants
    from specverify.verifier.tree.chain import as_chain_verifier

    out = []
    for e in mutants.entries(subject="tree"):
        mode = "any" if getattr(getattr(e.fn, "kernel", None), "target_only", False) else "iid"
        kind = "verifier" if e.lossy else "equivalent"
        out.append(dataclasses.replace(e, kind=kind, fn=as_chain_verifier(e.fn, mode=mode), name=f"tree:{e.name}"))
    return tuple(out)


def _peer_rows(entries, seed: int) -> tuple:
    from specverify.selftest.peers import peer_matrix

    rows = []
    for row in peer_matrix(entries, seed=seed):
        rows.append(
            {
                **{k: v for k, v in row.items() if k != "results"},
                "results": {
                    n: {"passed": r.passed, "samples": r.samples, "seconds": r.seconds}
                    for n, r in row["results"].items()
                },
            }
        )
    return tuple(rows)


def run_selftest(
    tier: str = "smoke",
    seed: int = 0,
    *,
    alpha: float = ALPHA,
    verifiers=None,
    equivalents=None,
    decoders: bool = True,
    drafters: bool = True,
    trees: bool = True,
    calibration: bool = True,
    lr: bool = False,
    peers: bool = False,
    schedule: bool = True,
    scenarios=None,
    calibration_options=None,
    lr_rows: int | None = None,
    progress=None,
    workers: int = 1,
) -> SelftestResult:
    """Run the selftest (see the module docstring).

    Parameters
    ----------
    tier : {"smoke", "standard", "deep"}
    seed : int
    alpha : float
        Family-wise alpha of every battery run (default 1e-3).
    verifiers, equivalents : sequence of CatalogueEntry, optional
        Entries expected to fail / to pass (default: the catalogue's ``verifier`` /
        ``equivalent`` entries).  Each needs ``name, kind, fn, provenance, needs, requires``.
    decoders, drafters, trees, calibration, lr, peers, schedule : bool
        Switch the parts on or off.
    scenarios : sequence of str, optional
        Override the scenario plan for every verifier entry.
    lr_rows : int, optional
        Monte Carlo rows per LR limit (default :data:`LR_ROWS` of the tier).
    calibration_options : dict, optional
        Keyword arguments for :func:`.calibration.run_calibration` (seeds, rows, ...).
    progress : callable, optional
        ``progress(message)`` before each entry (with ``workers > 1``: as each finishes).
    workers : int, default 1
        Worker processes (:mod:`.parallel`): every entry and the calibration run are
        independent, seeded parts, so the rows are the same for any number of workers; only
        the wall time (and each row's ``seconds``) changes.
    """
    if tier not in TIERS:
        raise InvalidArgument(f"tier must be one of {TIERS}, got {tier!r}")
    seed = check_int("seed", seed, minimum=0)
    alpha = check_alpha("alpha", alpha)
    workers = check_int("workers", workers, minimum=1)
    from specverify import mutants
    from specverify.core.environment import environment

    verifiers = tuple(mutants.entries("verifier") if verifiers is None else verifiers)
    equivalents = tuple(mutants.entries("equivalent") if equivalents is None else equivalents)
    say = progress or (lambda message: None)
    start = time.perf_counter()
    lr_rows = (check_int("lr_rows", lr_rows, minimum=1) if lr_rows is not None else LR_ROWS[tier]) if lr else None
    parts = [
        Part(
            f"{entry.kind} {entry.name}",
            run_verifier_entry,
            {
                "entry": entry,
                "tier": tier,
                "seed": seed,
                "alpha": alpha,
                "scenarios": scenarios,
                "schedule": schedule,
                "lr_rows": lr_rows if entry.kind == "verifier" else None,
            },
        )
        for entry in verifiers + equivalents
    ]
    common = {"tier": tier, "seed": seed, "alpha": alpha}
    for on, subject, fn in (
        (decoders, "decoder", run_decoder_mutants),
        (trees, "tree", run_tree_entries),
        (drafters, "drafter", run_drafter_mutants),
    ):
        if on:  # one part per entry: each builds its own seeded models, as the whole loop would
            parts += [
                Part(f"{subject} {e.name}", fn, {**common, "names": (e.name,)})
                for e in mutants.entries(subject=subject)
            ]
    if calibration:
        # the calibration run has its own alpha (CALIBRATION_ALPHA), not the batteries'
        parts.append(Part("calibration", run_calibration, {"tier": tier, "seed": seed, **(calibration_options or {})}))
    outputs = run_parts(parts, workers=workers, progress=say)
    rows: list = []
    notes: list = []
    cal = None
    for part, out in zip(parts, outputs):
        if part.fn is run_verifier_entry:
            rows.append(out)
        elif part.fn is run_drafter_mutants:
            rows += out[0]
            if out[1] not in notes:
                notes.append(out[1])
        elif part.fn is run_calibration:
            cal = out
        else:
            rows += out
    peer_rows = None
    if peers:
        say("peers")
        peer_rows = _peer_rows(verifiers + equivalents + (_tree_entries_as_chains() if trees else ()), seed)
    return SelftestResult(
        rows=tuple(rows),
        calibration=cal,
        peers=peer_rows,
        tier=tier,
        seed=seed,
        alpha=alpha,
        seconds=time.perf_counter() - start,
        notes=tuple(notes),
        environment=environment(),
    )


def main(
    tier: str = "smoke", seed: int = 0, as_json: bool = False, matrix_path=None, *, stream=None, workers: int = 1
) -> int:
    """CLI entry: run the selftest, print the matrix (or JSON), optionally write the Markdown matrix.

    Returns 1 if a catalogued mutant survived or a correct variant failed, else 0.
    """
    out = stream if stream is not None else sys.stdout
    with_matrix = matrix_path is not None

    def progress(message: str) -> None:
        print(f"[selftest] {message}", file=sys.stderr, flush=True)

    result = run_selftest(
        tier=tier,
        seed=seed,
        lr=with_matrix or tier != "smoke",
        peers=with_matrix,
        progress=None if as_json else progress,
        workers=workers,
    )
    print(render_json(result) if as_json else render_text(result), file=out)
    if with_matrix:
        from pathlib import Path

        from specverify.core.files import atomic_write_text

        argv = f"specverify selftest --tier {tier} --seed {seed} --matrix {matrix_path}"
        atomic_write_text(Path(matrix_path), render_markdown(result, command=argv))
        if not as_json:
            print(f"matrix: {matrix_path}", file=out)
    return 0 if result.passed else 1
