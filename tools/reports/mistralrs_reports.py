"""Regenerate the mistral.rs (PyPI ``mistralrs``) audit reports under ``reports/mistralrs/`` (never written by hand).

::

    python -m tools.reports.mistralrs_reports --out reports/mistralrs --seed 0 --tier smoke [--only NAME ...]

Needs mistralrs (:data:`specverify.adapters.mistralrs.INSTALL`).  Each configuration of
:data:`CONFIGS` runs as ``specverify audit --decoder specverify.adapters.mistralrs:tiny_decoder
--target specverify.adapters.mistralrs:tiny_target ...`` in its own process (through
:func:`tools.reports.common.run_config`), at the battery's sizes.  Every configuration is plain
decoding (no draft): mistral.rs 0.9.5's speculative path needs PagedAttention, which its CPU build
lacks.  :func:`probe` records that refusal, the seeding facts and the engine's law against
transformers' (``probe.json``); ``README.md`` is written from the ``report.json`` files,
``probe.json`` and the template ``templates/mistralrs.md``, which states the engine's rule as read
in its source.  The audits run with ``RAYON_NUM_THREADS=1`` (the engine's thread pool).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from specverify.core.files import atomic_write_text
from tools.reports.common import engine_versions, read_template, readme_fields, report_main, repro_lines

__all__ = ["CONFIGS", "SPECULATIVE", "MINP_PREFIX", "config_args", "probe", "minp_boundary", "write_readme", "main"]

MOD = "specverify.adapters.mistralrs"

PURE = dict(temperature=1.0)  # top_k / top_p / min_p off: the model's own law
TRUNC = dict(temperature=0.7, top_k=8, top_p=0.9)
MINP = dict(temperature=1.0, min_p=0.1)
PENALTIES = dict(temperature=1.0, repetition_penalty=1.5, frequency_penalty=0.5, presence_penalty=0.7)
GREEDY = dict(temperature=0.0)

SETTINGS = (
    ("t1.0", "T=1, top-k / top-p / min-p off", PURE),
    ("t0.7_topk8_topp0.9", "T=0.7, top_k=8, top_p=0.9", TRUNC),
    ("t1.0_minp0.1", "T=1, min_p=0.1", MINP),
    ("penalties", "T=1, repetition 1.5 (prompt included), frequency 0.5, presence 0.7", PENALTIES),
    ("greedy", "temperature=0 (argmax)", GREEDY),
)

#: (name, description, decoder options, sampler options) of every audited configuration.
CONFIGS = tuple((f"control_{name}", f"no draft; {what}", dict(assistant="none"), s) for name, what, s in SETTINGS)
#: The speculative configurations asked for and refused on CPU (``Runner(mtp_model=...)``), K = mtp_n_predict.
SPECULATIVE = tuple(
    (f"mtp_k{k}_{name}", f"MTP assistant (tiny draft), mtp_n_predict={k}; {what}", dict(assistant="draft", mtp_n_predict=k), s)
    for k in (1, 3, 5)
    for name, what, s in SETTINGS
    if name in ("t1.0", "t0.7_topk8_topp0.9", "greedy")
)  # fmt: skip
TEMPLATE = read_template("mistralrs.md")
#: Filled in by hand from the timed install (the generator cannot time it).
INSTALL_RECORD = (
    "Measured on this project's 2-core machine with two other CPU-heavy jobs beside it: the line above, run "
    "as one `nice -n 5` command into a fresh virtualenv, took 126 s (the `mistralrs` 0.9.5 wheel is a "
    "prebuilt 79 MB abi3 CPU build; nothing is compiled)."
)


def config_args(decoder: dict, sampler: dict) -> list[str]:
    """Audit arguments: ``tiny_decoder`` with all options against ``tiny_target`` with the sampler ones."""
    args = ["--decoder", f"{MOD}:tiny_decoder"]
    for key, value in {**decoder, **sampler}.items():
        args += ["--decoder-option", f"{key}={value}"]
    args += ["--target", f"{MOD}:tiny_target"]
    for key, value in sampler.items():
        args += ["--target-option", f"{key}={value}"]
    return args


def probe(*, seed: int = 0) -> dict:
    """The engine facts of the README: version, CPU refusals, seeding, law difference, speculative refusals."""
    from specverify.adapters.mistralrs import engine_version, max_conditional_difference, runner_probe, tiny_decoder

    facts = runner_probe(seed=seed)
    facts["version"] = engine_version()
    facts["max_conditional_difference"] = max_conditional_difference(seed=seed)
    refused: dict[str, str | None] = {}
    for name, _, decoder, sampler in SPECULATIVE:
        try:
            tiny_decoder(**decoder, **sampler).runner()
            refused[name] = None
        except Exception as error:  # ImplementationError carries the engine's message
            refused[name] = f"{type(error).__name__}: {error}"
    facts["speculative"] = refused
    facts["minp_boundary"] = minp_boundary(seed=seed)
    return facts


#: The prefix (prompt0 of seed 0, then row 1294's first four tokens) at which ``control_t1.0_minp0.1``
#: emitted token 24, a token the transformers-based law drops (ratio to the top token just under min_p 0.1).
MINP_PREFIX = (28, 31, 8, 31, 15, 18, 0, 24)
MINP_TOKEN = 24


def minp_boundary(*, seed: int = 0) -> dict:
    """p(token) / max p at :data:`MINP_PREFIX` under mistral.rs's own raw law and under transformers'."""
    import torch

    from specverify.adapters.mistralrs import engine_raw_law, tiny_target

    engine = engine_raw_law(list(MINP_PREFIX), seed=seed)  # (V,)
    target = tiny_target(seed=seed, temperature=1.0)
    raw = torch.softmax(target.logits(torch.tensor([MINP_PREFIX]))[0, -1].double(), -1)  # (V,)
    return dict(
        prefix=list(MINP_PREFIX),
        token=MINP_TOKEN,
        engine_ratio=float(engine[MINP_TOKEN] / engine.max()),
        transformers_ratio=float(raw[MINP_TOKEN] / raw.max()),
    )


def _speculative_text(facts: dict) -> str:
    lines = []
    for name, what, _, _ in SPECULATIVE:
        error = facts.get("speculative", {}).get(name)
        verdict = "**NOT RUNNABLE** (refused at load)" if error else "loads (not audited)"
        lines.append(f"| `{name}` | {what} | {verdict} | {error or '-'} |")
    return "\n".join(lines)


def _minp_text(b: dict | None) -> str:
    if not b:
        return "(not probed)"
    return (
        f"after the prefix `{b['prefix']}` token {b['token']} has p / max p = {b['engine_ratio']:.7f} under "
        f"mistral.rs's own law and {b['transformers_ratio']:.7f} under transformers'"
    )


def _repro_text(out: Path) -> str:
    lines = repro_lines(out)
    if not lines:
        return "No engine fault was found, so there is no repro script (the min-p FAIL is the exact law's, above)."
    return "\n".join(["Each needs only the engine (no specverify); exit status 1 while the bug shows.", "", *lines])


def write_readme(out: Path, *, seed: int, tier: str) -> Path:
    """Write ``out/README.md`` from the configurations' ``report.json`` files and ``out/probe.json``."""
    from specverify.adapters.mistralrs import INSTALL

    facts = json.loads((out / "probe.json").read_text()) if (out / "probe.json").exists() else {}
    configs = [(name, what, None) for name, what, _, _ in CONFIGS]
    fields = readme_fields(out, configs, module="tools.reports.mistralrs_reports", seed=seed, tier=tier)
    diff = facts.get("max_conditional_difference")
    text = TEMPLATE.format(
        **fields,
        **engine_versions(mistralrs="mistralrs", transformers="transformers"),
        install=INSTALL,
        install_record=INSTALL_RECORD,
        max_diff="(not measured)" if diff is None else f"{diff:.2g}",
        mtp_error=facts.get("mtp", "(not probed)"),
        mtp_paged_error=facts.get("mtp_paged", "(not probed)"),
        seed_error=facts.get("seed", "(not probed)"),
        seed_later="no error (ignored)" if facts.get("seed_later") is None else facts["seed_later"],
        fresh_agree=facts.get("fresh_runners_agree", "(not probed)"),
        minp=_minp_text(facts.get("minp_boundary")),
        speculative=_speculative_text(facts),
        repro=_repro_text(out),
    )
    return atomic_write_text(out / "README.md", text)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("RAYON_NUM_THREADS", "1")  # the audits' subprocesses inherit it
    configs = [(name, config_args(d, s)) for name, _, d, s in CONFIGS]

    def readme(out: Path, *, seed: int, tier: str) -> Path:
        if "--readme-only" not in argv:
            facts = probe(seed=seed)
            atomic_write_text(out / "probe.json", json.dumps(facts, indent=1) + "\n")
            print(f"probe: {facts}", flush=True)
        return write_readme(out, seed=seed, tier=tier)

    return report_main(argv, doc=__doc__, default_out="reports/mistralrs", configs=configs, write_readme=readme)


if __name__ == "__main__":
    sys.exit(main())
