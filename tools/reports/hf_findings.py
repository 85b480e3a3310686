"""Findings of reading transformers' ``_speculative_sampling``, their upstream status and their repro scripts.

Both findings are far too rare for a statistical battery to observe (probabilities ~1e-8 per
draft), so each has a standalone script, ``reports/hf-transformers/repro_*.py`` (the single
source: the scripts need only torch and transformers, not specverify, and exit 1 while the
bug shows).  The HF audit (:mod:`tools.reports.hf_reports`) copies each script next to its
reports when it writes elsewhere, runs it in a subprocess (:func:`run_repro`) and quotes its
output and exit status in the generated README.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

__all__ = ["FINDINGS", "REPRO_DIR", "REPRO_INSTALL", "REPRO_SCRIPTS", "UPSTREAM_CHECKED", "repro_source", "run_repro"]

#: Where the scripts live: ``reports/hf-transformers/`` of the checkout this package runs from.
REPRO_DIR = Path(__file__).resolve().parents[2] / "reports" / "hf-transformers"

#: What a script needs (a virtualenv without specverify is enough).
REPRO_INSTALL = "pip install torch==2.13.0 transformers==5.24.0"

#: The releases the upstream status was checked against.
UPSTREAM_CHECKED = (
    "transformers 5.25.0 (the newest release on PyPI when checked; its `_speculative_sampling` read from the "
    "wheel) and huggingface/transformers issues and pull requests"
)

#: (script file name, title, explanation, upstream status) of every finding, in README order.
FINDINGS = (
    (
        "repro_zero_uniform_support.py",
        "Zero uniform accepts a forbidden draft (support violation, ~2**-24 per draft with p(x) = 0)",
        "`_speculative_sampling` accepts draft token x iff `r <= p(x)/q(x)` with `r = torch.rand_like(...)` in "
        "float32. For a draft the target forbids (p(x) = 0 < q(x), e.g. a token outside the target's top-k / top-p "
        "set that the assistant proposes) the ratio is 0 and the draft is accepted iff r == 0 exactly. A float32 "
        "`torch.rand` on CPU is a multiple of 2**-24 in [0, 1), so this happens with probability 2**-24 ~ 5.96e-8 "
        "per such draft: an emitted token with target probability 0 at a rate of 2**-24 times the assistant's mass "
        "outside the target's support, per drafted position (e.g. one per ~1.7e8 drafted positions when that mass is "
        "0.1). The canonical rule `u * q(x) < p(x)` (strict) never does. Far too rare for a statistical battery to "
        "observe; found by reading the code and demonstrated deterministically by forcing r = 0, in the kernel and "
        "in `generate(assistant_model=...)` on a tiny Llama pair the script builds (the target's law in float64):",
        "**fixed in transformers 5.25.0**: `is_accepted = r_i < probability_ratio`, with a comment naming this case "
        "(a zero-probability token accepted when `r_i` is exactly 0); the script exits 0 there. No upstream issue or "
        "pull request found with the search tool (the same bug in SGLang: sgl-project/sglang#35771, fixed by sgl-project/sglang#35798).",
    ),
    (
        "repro_zero_residual_nan.py",
        "All-zero float32 residual on rejection: 0/0 = NaN and `torch.multinomial` raises",
        "On rejection the kernel divides `clamp(p - q, min=0)` by its sum without a zero check (the ensemble "
        "path has one, the lossless path does not). In exact arithmetic a rejection needs p(x) < q(x), which forces "
        "p(y) > q(y) for some y, so the residual has positive mass; in float32 the residual is all zero whenever "
        "p <= q elementwise at the rejected position. Two ways this happens: (A) both laws so peaked that p(a) and "
        "q(a) round to exactly 1.0 while q keeps a tiny tail, and the assistant drafts a tail token x with "
        "p(x) < q(x) (probability ~q(x) per position, then rejected with probability 1 - p(x)/q(x)); the exact "
        "answer is token a, the kernel raises `RuntimeError` and `generate` crashes; (B) p and q equal up to float32 "
        "rounding (e.g. the same logits up to an additive constant, as in the demonstration). p(x) = q(x) = 0 alone "
        "cannot trigger it in `generate` (the draft is sampled from q, so q(x) > 0). Probabilities are ~1e-9 per "
        "verification, so not observable statistically; demonstrated deterministically:",
        "**open: no upstream report found; still in transformers 5.25.0** (the script exits 1 there too). "
        "huggingface/transformers#45979 (`assistant_ensemble_weight`, merged) added a zero-residual fallback for "
        "the ensemble path only (its comment: lossless speculative decoding keeps its original behaviour); the "
        "division by the residual's sum dates from huggingface/transformers#28508 (January 2024, which replaced a "
        "softmax of the residual by its normalisation).",
    ),
)

#: The script names, in README order.
REPRO_SCRIPTS = tuple(script for script, *_ in FINDINGS)


def repro_source(script: str) -> Path:
    """The committed script ``reports/hf-transformers/<script>`` (raises ``FileNotFoundError`` outside a checkout)."""
    path = REPRO_DIR / script
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: the HF repro scripts live in a specverify checkout")
    return path


def run_repro(path: Path, *, timeout: float = 600.0) -> tuple[str, int]:
    """Run a repro script in its own interpreter (``python -I``, in its folder); return (stdout, exit status).

    A status other than 0 (fixed) or 1 (the bug shows) means the script itself broke: its
    stderr's last lines are appended to the output.
    """
    path = Path(path)
    proc = subprocess.run(
        [sys.executable, "-I", path.name], cwd=path.parent, capture_output=True, text=True, timeout=timeout
    )
    out = proc.stdout
    if proc.returncode not in (0, 1):
        out += "".join(proc.stderr.splitlines(keepends=True)[-5:])
    return out, proc.returncode
