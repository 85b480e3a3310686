"""Float64 arithmetic whose every bit is the same on every CPU: exp, log, powers, softmax, row sums.

torch and numpy pick their float64 kernels for ``exp``, ``log``, ``pow`` and ``sum`` by the
CPU they run on (AVX-512, AVX2 or scalar code, ``ATEN_CPU_CAPABILITY``,
``NPY_DISABLE_CPU_FEATURES``): the results agree to an ulp or two but not to the bit, and a
reduction's association depends on the vector width.  The laws of the suite's table models and
drafters are built here instead, from operations IEEE 754 rounds correctly on every path
(``+ - * /``, comparisons, exact scaling by powers of two built from their bits) and from sums
whose order is fixed, so a law -- and every token drawn from it, every bin and every ordering
derived from it -- is a function of the seed alone (docs/reproducibility.md).

Accuracy: :func:`exp` and :func:`log` are within 2 ulp of the correctly rounded value on
float64's normal range (tested against ``math.exp``/``math.log``); :func:`row_sums` sums each row
in index order (``cumsum``, a sequential loop on every CPU path), which for the rows built here
(V <= 2^15, positive terms) is within ``V * 2^-53`` relative of the exact sum.

References: Tang, "Table-driven implementation of the exponential function in IEEE
floating-point arithmetic", ACM TOMS 15 (1989) (the argument reduction with a two-part ln 2);
Muller, "Elementary Functions", 3rd ed. (2016), ch. 11 (the atanh series for log).
"""

from __future__ import annotations

import math

import torch

_F64 = torch.float64
#: ln 2 split so that ``k * _LN2_HI`` is exact for |k| < 2^20 (its low 32 bits are zero).
_LN2_HI = float.fromhex("0x1.62e42fee00000p-1")
_LN2_LO = float.fromhex("0x1.a39ef35793c76p-33")  # ln 2 - _LN2_HI to 53 more bits (fdlibm's ln2_lo)
_INV_LN2 = 1.0 / math.log(2.0)
#: 1/n! for the Taylor series of exp on |r| <= ln(2)/2 (the error of degree 13 is below 2^-60).
_EXP_COEFFS = tuple(1.0 / math.factorial(n) for n in range(14))
#: 2/(2n+1) for log(m) = 2 atanh(s), s = (m-1)/(m+1), |s| <= 0.1716 (degree 25: below 2^-60).
_ATANH_COEFFS = tuple(2.0 / (2 * n + 1) for n in range(13))
_EXP_MAX = 709.782712893384  # log of the largest float64
_EXP_MIN = -745.2  # exp(-745.14) is the smallest subnormal


def _pow2(k: torch.Tensor) -> torch.Tensor:
    """2^k exactly, from the bits of a float64, for integer k in [-1022, 1023] (int64 tensor)."""
    return ((k + 1023) << 52).view(_F64)


def _scale(x: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """x * 2^k for x in [0.5, 2] and k in [-1075, 1024], in two exact steps (the second may round to a subnormal)."""
    half = torch.div(k, 2, rounding_mode="floor")
    return x * _pow2(half) * _pow2(k - half)


def _horner(r: torch.Tensor, coeffs) -> torch.Tensor:
    """sum_n coeffs[n] r^n by Horner's rule, one correctly rounded multiply and add per step."""
    acc = torch.full_like(r, coeffs[-1])
    for c in reversed(coeffs[:-1]):
        acc.mul_(r).add_(c)  # two roundings, never fused
    return acc


def exp(x: torch.Tensor) -> torch.Tensor:
    """exp(x) elementwise in float64, bit-identical on every CPU; ``exp(-inf) = 0``, ``exp(nan) = nan``.

    ``x = k ln2 + r`` with ``|r| <= ln2/2``, ``exp(r)`` by its Taylor series, then scaled by 2^k.
    """
    x = torch.as_tensor(x, dtype=_F64)
    clipped = x.clamp(_EXP_MIN, _EXP_MAX)
    k = torch.round(clipped * _INV_LN2)
    r = (clipped - k * _LN2_HI) - k * _LN2_LO
    out = _scale(_horner(r, _EXP_COEFFS), k.to(torch.int64))
    out = torch.where(x < _EXP_MIN, torch.zeros_like(out), out)
    out = torch.where(x > _EXP_MAX, torch.full_like(out, math.inf), out)
    return torch.where(torch.isnan(x), x, out)


def log(x: torch.Tensor) -> torch.Tensor:
    """log(x) elementwise in float64, bit-identical on every CPU; ``log(0) = -inf``, negative -> nan.

    ``x = m 2^e`` with ``m`` in [sqrt(1/2), sqrt(2)) (exact, from the bits; subnormals are scaled
    by 2^64 first), ``log m = 2 atanh((m-1)/(m+1))`` by its series, plus ``e ln2`` in two parts.
    """
    x = torch.as_tensor(x, dtype=_F64)
    tiny = x < 2.0**-1000
    y = torch.where(tiny, x * 2.0**64, x)  # exact scaling of subnormals into the normal range
    bits = y.abs().view(torch.int64)
    e = (bits >> 52) - 1023
    m = ((bits & ((1 << 52) - 1)) | (1023 << 52)).view(_F64)  # [1, 2)
    big = m > math.sqrt(2.0)
    m = torch.where(big, m * 0.5, m)
    e = e + big.to(torch.int64) - 64 * tiny.to(torch.int64)
    s = (m - 1.0) / (m + 1.0)
    series = s * _horner(s * s, _ATANH_COEFFS)
    ef = e.to(_F64)
    out = ef * _LN2_HI + (series + ef * _LN2_LO)
    out = torch.where(x == 0, torch.full_like(out, -math.inf), out)
    out = torch.where(x == math.inf, x, out)
    return torch.where((x < 0) | torch.isnan(x), torch.full_like(out, math.nan), out)


def power(x: torch.Tensor, exponent: float) -> torch.Tensor:
    """``x ** exponent`` for x >= 0 in float64 (``exp(exponent * log x)``), bit-identical on every CPU.

    ``0 ** exponent`` is 0 for a positive exponent and inf for a negative one.  Accurate to about
    ``|exponent log x| * 2^-52`` relative (a few ulp for the tables' exponents and magnitudes).
    """
    x = torch.as_tensor(x, dtype=_F64)
    out = exp(log(x) * float(exponent))
    if exponent == 0:
        out = torch.ones_like(out)
    return out


def row_sums(x: torch.Tensor, *, keepdim: bool = False) -> torch.Tensor:
    """Sums over the last dimension in index order (the same association on every CPU path)."""
    x = torch.as_tensor(x, dtype=_F64)
    if x.shape[-1] == 0:
        total = x.sum(-1, keepdim=True)
    else:
        total = x.cumsum(-1)[..., -1:]
    return total if keepdim else total.squeeze(-1)


def normalise(rows: torch.Tensor) -> torch.Tensor:
    """Rows divided by their :func:`row_sums` (float64)."""
    rows = torch.as_tensor(rows, dtype=_F64)
    return rows / row_sums(rows, keepdim=True)


def softmax(logits: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dimension in float64, bit-identical on every CPU (``-inf`` logits get 0)."""
    logits = torch.as_tensor(logits, dtype=_F64)
    top = logits.amax(-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    return normalise(exp(logits - top))
