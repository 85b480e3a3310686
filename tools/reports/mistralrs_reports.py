"""Regenerate the mistral.rs (PyPI ``mistralrs``) audit reports under ``reports/mistralrs/`` (never written by hand).

::

    python -m tools.reports.mistralrs_reports --out reports/mistralrs --seed 0 --tier smoke [--only NAME ...]

Needs mistralrs (:data:`specverify.adapters.mistralrs.INSTALL`).  Each configuration of
:data:`CONFIGS` runs as ``specverify audit --decoder specverify.adapters.mistralrs:tiny_decoder
--target specverify.adapters.mistralrs:tiny_target ...`` in its own process (through
:func:`tools.reports.common.run_config`), at the battery's sizes.  Every configuration is plain
decoding (no draft): mistral.rs 0.9.5's speculative path needs PagedAttention, which its CPU build
lacks.  :func:`probe` records that refusal, the seeding facts and the engine's law against
transformers' with the KV cache in float32 (the audited setting, ``MISTRALRS_CPU_KV_F32=1``) and in
the engine's CPU default float16 (measured in a child process: the engine reads the switch once per
process) (``probe.json``); ``README.md`` is written from the ``report.json`` files,
``probe.json`` and the template ``templates/mistralrs.md``, which states the engine's rule as read
in its source.  The audits run with ``RAYON_NUM_THREADS=1`` (the engine's thread pool).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from specverify.core.files import atomic_write_text
from tools.reports.common import decoder_target_args, engine_versions, read_template, readme_fields, report_main, repro_lines

__all__ = [
    "CONFIGS",
    "SPECULATIVE",
    "MINP_PREFIX",
    "FOLLOWUP_PROMPT",
    "config_args",
    "probe",
    "minp_boundary",
    "later_rows",
    "write_readme",
    "main",
]

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
    return decoder_target_args(MOD, target_keys=tuple(sampler), **decoder, **sampler)


def probe(*, seed: int = 0) -> dict:
    """The engine facts of the README: version, CPU refusals, seeding, law difference, speculative refusals."""
    from specverify.adapters.mistralrs import engine_version, max_conditional_difference, runner_probe, tiny_decoder

    facts = runner_probe(seed=seed)
    facts["version"] = engine_version()
    facts["max_conditional_difference"] = max_conditional_difference(seed=seed)
    facts["max_conditional_difference_kv_f16"] = _kv_f16(
        f"max_conditional_difference(seed={seed}, kv_f32=False)", "max_conditional_difference"
    )
    refused: dict[str, str | None] = {}
    for name, _, decoder, sampler in SPECULATIVE:
        try:
            tiny_decoder(**decoder, **sampler).runner()
            refused[name] = None
        except Exception as error:  # ImplementationError carries the engine's message
            refused[name] = f"{type(error).__name__}: {error}"
    facts["speculative"] = refused
    facts["minp_boundary"] = minp_boundary(seed=seed)
    facts["later_rows"] = later_rows(seed=seed)
    return facts


#: The prefix (prompt0 of seed 0, then row 1294's first four tokens) at which ``control_t1.0_minp0.1``, run
#: with the engine's default float16 KV cache, emitted token 24, a token the float32 law drops (ratio to
#: the top token just under min_p 0.1).
MINP_PREFIX = (28, 31, 8, 31, 15, 18, 0, 24)
MINP_TOKEN = 24


def _kv_f16(call: str, name: str):
    """The JSON value of ``call`` (a function of specverify.adapters.mistralrs) run in a child process
    with the engine's default float16 CPU KV cache (``kv_f32=False`` in the call)."""
    code = f"import json\nfrom specverify.adapters.mistralrs import {name}\nprint(json.dumps({call}))\n"
    env = {**os.environ, "MISTRALRS_CPU_KV_F32": "0"}
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, env=env)
    if child.returncode != 0:
        raise RuntimeError(f"{call} in a child process failed: {child.stderr.strip()[-2000:]}")
    return json.loads(child.stdout.strip().splitlines()[-1])


def minp_boundary(*, seed: int = 0) -> dict:
    """p(token) / max p at :data:`MINP_PREFIX` under mistral.rs's own raw law (KV cache float32 and
    float16) and under transformers'."""
    import torch

    from specverify.adapters.mistralrs import engine_raw_law, tiny_target

    engine = engine_raw_law(list(MINP_PREFIX), seed=seed)  # (V,)
    f16 = _kv_f16(f"engine_raw_law({list(MINP_PREFIX)}, seed={seed}, kv_f32=False).tolist()", "engine_raw_law")
    engine_f16 = torch.tensor(f16, dtype=torch.float64)  # (V,)
    target = tiny_target(seed=seed, temperature=1.0)
    raw = torch.softmax(target.logits(torch.tensor([MINP_PREFIX]))[0, -1].double(), -1)  # (V,)
    return dict(
        prefix=list(MINP_PREFIX),
        token=MINP_TOKEN,
        engine_ratio=float(engine[MINP_TOKEN] / engine.max()),
        engine_ratio_kv_f16=float(engine_f16[MINP_TOKEN] / engine_f16.max()),
        transformers_ratio=float(raw[MINP_TOKEN] / raw.max()),
    )


#: ``control_t1.0``'s prompt1 at seed 0, whose first-token goodness of fit is its smallest p.
FOLLOWUP_PROMPT = (21, 4, 17, 22, 19, 21)


def later_rows(*, seed: int = 0, blocks: int = 3, rows: int = 4000) -> dict:
    """First-token fit of ``control_t1.0``'s decoder at :data:`FOLLOWUP_PROMPT` on rows after the audit's.

    One call of ``(blocks + 1) * rows`` rows: the first ``rows`` are the audit's own draws (the
    engine's random stream restarts at its constant seed for every call), each later block is a
    disjoint stretch of that stream, hence a fresh sample; each is tested with the battery's
    :func:`~specverify.stats.gof.gof_test` against the exact law (T = 1), and the later blocks pooled.
    """
    import numpy as np
    import torch

    from specverify.adapters.mistralrs import tiny_decoder, tiny_target
    from specverify.stats.gof import gof_test

    prompt = torch.tensor(FOLLOWUP_PROMPT)
    law = tiny_target(seed=seed, temperature=1.0).next_token_probs(prompt[None])[0].numpy()  # (V,)
    n = (blocks + 1) * rows
    first = tiny_decoder(seed=seed, temperature=1.0).generate(prompt, num_samples=n, max_new_tokens=8, seed=seed)
    first = first[:, 0].numpy()  # (n,)

    def fit(x) -> dict:
        r = gof_test(np.bincount(x, minlength=law.shape[0]), law)
        mde = None if r.mde_tv is None else float(r.mde_tv)
        return dict(n=len(x), statistic=float(r.statistic), p=float(r.pvalue), mde_tv=mde)

    return dict(
        prompt=list(FOLLOWUP_PROMPT),
        audit=fit(first[:rows]),
        blocks=[fit(first[(b + 1) * rows : (b + 2) * rows]) for b in range(blocks)],
        pooled=fit(first[rows:]),
    )


def _later_rows_text(f: dict | None) -> str:
    if not f:
        return "(not probed)"
    blocks = ", ".join(f"p = {b['p']:.2g}" for b in f["blocks"])
    pooled = f["pooled"]
    return (
        f"after the prompt `{f['prompt']}` the audit's {f['audit']['n']} first tokens give p = {f['audit']['p']:.2g} "
        f"on the battery's goodness-of-fit test; the next {len(f['blocks'])} blocks of {f['audit']['n']} rows of the "
        f"same call (disjoint stretches of the engine's stream) give {blocks}, and the {pooled['n']} pooled "
        f"p = {pooled['p']:.2g}" + ("" if pooled["mde_tv"] is None else f" (detectable TV {pooled['mde_tv']:.2g})")
    )


def _speculative_text(facts: dict) -> str:
    lines = []
    for name, what, _, _ in SPECULATIVE:
        error = facts.get("speculative", {}).get(name)
        verdict = "**NOT RUNNABLE** (refused at load)" if error else "loads (not audited)"
        lines.append(f"| `{name}` | {what} | {verdict} | {error or '-'} |")
    return "\n".join(lines)


def _minp_text(b: dict | None) -> str:
    if not b or "engine_ratio_kv_f16" not in b:
        return "(not probed)"
    return (
        f"after the prefix `{b['prefix']}` token {b['token']} has p / max p = {b['engine_ratio_kv_f16']:.7f} "
        f"under mistral.rs's own law with its default float16 KV cache, {b['engine_ratio']:.7f} with the "
        f"float32 KV cache audited here, and {b['transformers_ratio']:.7f} under transformers'"
    )


def _repro_text(out: Path) -> str:
    lines = repro_lines(out)
    if not lines:
        return "No engine fault was found, so there is no repro script."
    return "\n".join(["Each needs only the engine (no specverify); exit status 1 while the bug shows.", "", *lines])


def write_readme(out: Path, *, seed: int, tier: str) -> Path:
    """Write ``out/README.md`` from the configurations' ``report.json`` files and ``out/probe.json``."""
    from specverify.adapters.mistralrs import INSTALL

    facts = json.loads((out / "probe.json").read_text()) if (out / "probe.json").exists() else {}
    configs = [(name, what, None) for name, what, _, _ in CONFIGS]
    fields = readme_fields(out, configs, module="tools.reports.mistralrs_reports", seed=seed, tier=tier)
    diff, diff16 = facts.get("max_conditional_difference"), facts.get("max_conditional_difference_kv_f16")
    text = TEMPLATE.format(
        **fields,
        **engine_versions(mistralrs="mistralrs", transformers="transformers"),
        install=INSTALL,
        install_record=INSTALL_RECORD,
        max_diff="(not measured)" if diff is None else f"{diff:.2g}",
        max_diff_f16="(not measured)" if diff16 is None else f"{diff16:.2g}",
        mtp_error=facts.get("mtp", "(not probed)"),
        mtp_paged_error=facts.get("mtp_paged", "(not probed)"),
        seed_error=facts.get("seed", "(not probed)"),
        seed_later="no error (ignored)" if facts.get("seed_later") is None else facts["seed_later"],
        fresh_agree=facts.get("fresh_runners_agree", "(not probed)"),
        minp=_minp_text(facts.get("minp_boundary")),
        later_rows=_later_rows_text(facts.get("later_rows")),
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
