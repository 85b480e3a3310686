"""The types a report's JSON must have before it is rebuilt into a :class:`~specverify.core.results.Report`.

A ``report.json`` may come from anywhere (a colleague, a CI artefact, a server's audit copied
around): :func:`checked_report` checks every field the rebuilt report and its renderers rely on
and raises :class:`~specverify.core.errors.InvalidArgument` naming the first field that is wrong,
so that a report that loads is a report that renders.  Floats written as ``"nan"`` / ``"inf"``
strings (how the writer spells them) are read back as floats.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Mapping
from typing import Any

from specverify.core.errors import InvalidArgument

__all__ = ["checked_report", "checked_result", "VERDICTS", "GRADES"]

VERDICTS = ("pass", "suspicious", "fail", "error")
GRADES = ("pass", "suspicious", "fail")
_FLOAT_WORDS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "infinity": math.inf, "-infinity": -math.inf}


def _where(field: str, value: Any, wanted: str) -> InvalidArgument:
    shown = reprlib.repr(value)  # bounded: a field may hold megabytes
    field = "".join(c if c.isprintable() else "?" for c in field[:80])  # a key may hold anything
    return InvalidArgument(f"report field {field} must be {wanted}, got {shown}")


def _number(field: str, value: Any, *, optional: bool = False) -> float | int | None:
    if value is None and optional:
        return None
    if isinstance(value, str) and value.strip().lower() in _FLOAT_WORDS:
        return _FLOAT_WORDS[value.strip().lower()]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _where(field, value, "a number" + (" or null" if optional else ""))
    if isinstance(value, int) and abs(value) > 2**1000:
        raise _where(field, value, "a number within float range")
    return value  # as written (an integer stays one: the report reads back as it was)


def _integer(field: str, value: Any, *, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or abs(value) > 2**63:
        raise _where(field, value, "an integer" + (" or null" if optional else ""))
    return value


def _string(field: str, value: Any) -> str:
    if not isinstance(value, str):
        raise _where(field, value, "a string")
    return value


def _mapping(field: str, value: Any) -> dict:
    if not isinstance(value, Mapping):
        raise _where(field, value, "an object")
    return dict(value)


def checked_result(data: Any, index: int) -> dict:
    """The fields of result ``index`` with their types checked (floats spelled as words read back)."""
    field = f"results[{index}]"
    data = _mapping(field, data)
    out = dict(data)
    for name in ("statistic", "pvalue"):
        out[name] = _number(f"{field}.{name}", data.get(name))
    for name in ("name", "family", "method"):
        out[name] = _string(f"{field}.{name}", data.get(name))
    out["n"] = _integer(f"{field}.n", data.get("n"))
    for name in ("df", "multi_token_mass", "mde_tv", "alpha", "adjusted_pvalue"):
        if name in data:
            out[name] = _number(f"{field}.{name}", data[name], optional=True)
    if "bins" in data:
        out["bins"] = _integer(f"{field}.bins", data["bins"], optional=True)
    if data.get("grade") is not None and data.get("grade") not in GRADES:
        raise _where(f"{field}.grade", data.get("grade"), f"one of {GRADES} or null")
    for name in ("scenario", "position"):
        if name in data:
            out[name] = _string(f"{field}.{name}", data[name])
    if "details" in data:
        out["details"] = _mapping(f"{field}.details", data["details"])
    return out


def checked_report(data: Any) -> dict:
    """The fields of a report's JSON object with their types checked (see the module docstring)."""
    data = _mapping("(the whole report)", data)
    out = dict(data)
    for name in ("kind", "implementation", "tier"):
        out[name] = _string(name, data.get(name))
    if "command" in data:  # optional: a report without one gets a snippet comment
        out["command"] = _string("command", data["command"])
    out["seed"] = _integer("seed", data.get("seed"))
    alpha = _number("alpha", data.get("alpha"))
    if alpha is None or not 0 < alpha < 1:
        raise _where("alpha", data.get("alpha"), "a number in (0, 1)")
    out["alpha"] = alpha
    if data.get("verdict") not in VERDICTS:
        raise _where("verdict", data.get("verdict"), f"one of {VERDICTS}")
    results = data.get("results", [])
    if not isinstance(results, list):
        raise _where("results", results, "a list")
    out["results"] = [checked_result(r, i) for i, r in enumerate(results)]
    for name in ("errors", "scenarios"):
        value = data.get(name, [])
        if not isinstance(value, list):
            raise _where(name, value, "a list")
    if not all(isinstance(e, str) for e in data.get("errors", [])):
        raise _where("errors", data.get("errors"), "a list of strings")
    if not all(isinstance(s, Mapping) for s in data.get("scenarios", [])):
        raise _where("scenarios", data.get("scenarios"), "a list of objects")
    if "timings" in data:
        timings = _mapping("timings", data["timings"])
        out["timings"] = {str(k): _number(f"timings.{k}", v) for k, v in timings.items()}
    for name in ("environment", "extra"):
        if name in data:
            out[name] = _mapping(name, data[name])
    if "gate_conformance" in data and not isinstance(data["gate_conformance"], bool):
        raise _where("gate_conformance", data["gate_conformance"], "true or false")
    return out
