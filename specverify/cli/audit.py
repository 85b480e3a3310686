"""``specverify audit``: build the implementations from their specs, run the audit, record its repro.

:func:`run_audit` turns parsed ``audit`` arguments into a :class:`~specverify.core.results.Report`
whose ``command`` is :func:`audit_command` of the same arguments: the canonical command line
of what ran (every spec with every ``--ROLE-option``, tier, seed, alpha, scenario filter, sample
sizes and drafter cost model), which the CLI's own parser reads back to the same run.

Building an implementation from ``PKG.MOD:NAME`` and ``--ROLE-option KEY=VALUE`` pairs
(:func:`build`) checks the options against the factory's or class's signature first, so a
missing or unknown option is one :class:`BuildError` line naming the spec, the option names
and the ``--ROLE-option KEY=VALUE`` form; a factory that raises becomes one line with its
exception type and message (the exception is kept as ``__cause__`` for ``--debug``).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import shlex
from collections.abc import Mapping
from typing import Any

from specverify.core.errors import InvalidArgument, SpecVerifyError
from specverify.core.loading import load_object, parse_options

__all__ = ["ROLES", "BuildError", "build", "build_verifier", "role_options", "audit_argv", "audit_command", "run_audit"]

ROLES = ("verifier", "tree_verifier", "decoder", "drafter", "target", "reference")
#: The method each role's object must have (a verifier may also be a plain callable).
METHODS = {
    "verifier": "verify",
    "tree_verifier": "verify_tree",
    "decoder": "generate",
    "drafter": "draft",
    "target": "next_token_probs",
    "reference": "generate",
}
#: Defaults of the drafter cost model (kept in sync with the parser in :mod:`specverify.cli.commands`).
DEFAULT_BANDWIDTH, DEFAULT_BYTES_PER_PARAM, DEFAULT_ALPHA = 3.35e12, 2.0, 1e-3


class BuildError(InvalidArgument):
    """An implementation could not be built from its spec and options (a usage error, exit 2)."""


def _names(names) -> str:
    return ", ".join(sorted(names))


def check_options(factory, spec: str, role: str, options: Mapping[str, Any]) -> None:
    """Raise :class:`BuildError` when ``factory(**options)`` cannot bind: missing or unknown options."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # builtins and extension types: let the call decide
        return
    accepts_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    named = {n: p for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    missing = [n for n, p in named.items() if p.default is p.empty and n not in options]
    positional_only = [n for n, p in params.items() if p.kind is p.POSITIONAL_ONLY and p.default is p.empty]
    unknown = [] if accepts_any else [k for k in options if k not in named]
    problems = []
    if missing or positional_only:
        problems.append("missing " + _names(missing + positional_only))
    if unknown:
        problems.append("unknown " + _names(unknown))
    if not problems:
        return
    what = "class" if isinstance(factory, type) else "factory"
    accepted = _names(named) if named else "no options"
    form = f"--{role}-option KEY=VALUE"
    hint = (
        f"positional-only {_names(positional_only)} cannot be given as {form}"
        if positional_only
        else f"give each as {form}; it accepts: {accepted}"
    )
    raise BuildError(
        f"--{role} {spec}: the {what} cannot be built from the given options: {'; '.join(problems)} ({hint})"
    )


def _call(factory, spec: str, role: str, options: Mapping[str, Any]):
    check_options(factory, spec, role, options)
    try:
        return factory(**options)
    except SpecVerifyError as error:
        raise BuildError(f"--{role} {spec}: {error}") from error
    except Exception as error:
        message = " ".join(str(error).split()) or "(no message)"
        raise BuildError(
            f"--{role} {spec}: building it raised {type(error).__name__}: {message} (--debug shows the traceback)"
        ) from error


def build(spec: str, role: str, options: Mapping[str, Any] | None = None):
    """The object with ``METHODS[role]`` named by ``spec``: an instance as it is, or a factory/class called with ``options``.

    Raises
    ------
    InvalidArgument
        The spec does not load (:func:`~specverify.core.loading.load_object`).
    BuildError
        Options given for an instance; missing or unknown options; the factory raised; the
        result has no ``METHODS[role]`` method.
    """
    options = dict(options or {})
    method = METHODS[role]
    obj = load_object(spec, argument=f"--{role}")
    if hasattr(obj, method) and not isinstance(obj, type):
        if options:
            raise BuildError(f"--{role} {spec}: it is an instance, not a factory, so --{role}-option does not apply")
        return obj
    if not callable(obj):
        raise BuildError(f"--{role} {spec}: neither a factory nor an object with a .{method} method")
    instance = _call(obj, spec, role, options)
    if not hasattr(instance, method):
        raise BuildError(f"--{role} {spec}: it returned {type(instance).__name__}, which has no .{method} method")
    return instance


def build_verifier(spec: str, options: Mapping[str, Any] | None = None, *, role: str = "verifier"):
    """The ``verify`` callable named by ``spec``: a function, an instance's ``.verify``, or a factory's/class's.

    ``role="tree_verifier"``: the same for a ``verify_tree`` callable (an instance's ``.verify_tree``).
    """
    options = dict(options or {})
    flag, method = _flag(role), METHODS[role]
    obj = load_object(spec, argument=flag)
    if isinstance(obj, type) or options:
        if not callable(obj):
            raise BuildError(f"{flag} {spec}: it is an instance, not a factory, so {flag}-option does not apply")
        if options and not isinstance(obj, type) and _looks_like_verify(obj):
            raise BuildError(f"{flag} {spec}: it is a {method} callable, not a factory: {flag}-option does not apply")
        obj = _call(obj, spec, role, options)
    if hasattr(obj, method) and not isinstance(obj, type):
        return getattr(obj, method)
    if not callable(obj):
        raise BuildError(f"{flag} {spec}: not a {method} callable (a function, or an object with .{method})")
    return obj


def _flag(role: str) -> str:
    """The command-line flag of a role: ``--tree-verifier`` for ``tree_verifier``."""
    return "--" + role.replace("_", "-")


def _looks_like_verify(obj) -> bool:
    try:
        params = inspect.signature(obj).parameters
    except (TypeError, ValueError):
        return False
    return "generator" in params and len(params) >= 4


def role_options(args) -> dict[str, dict[str, Any]]:
    """``{role: {key: value}}`` from the ``--ROLE-option`` lists of parsed arguments."""
    return {
        role: dict(parse_options(getattr(args, f"{role}_option", None), argument=f"--{role}-option")) for role in ROLES
    }


# ----------------------------------------------------------------------------- the recorded command


def _option_text(key: str, value: Any) -> str:
    """``KEY=VALUE`` that :func:`~specverify.core.loading.parse_options` reads back as ``value``."""
    if isinstance(value, str):
        try:
            plain = ast.literal_eval(value) == value
        except (ValueError, SyntaxError):
            plain = True
        if plain and value and value == value.strip():
            return f"{key}={value}"
    return f"{key}={value!r}"


def _number(value: float) -> str:
    """Shortest text that reads back as exactly ``value`` (``0.001``, ``8e+09``)."""
    text = f"{value:g}".replace("e+0", "e").replace("e+", "e").replace("e-0", "e-")
    return text if float(text) == value else repr(value)


def kind_of(args) -> str:
    """``"drafter"``, ``"decoder"``, ``"tree_verifier"`` or ``"verifier"`` (the first given, in that order)."""
    for kind in ("drafter", "decoder", "tree_verifier", "verifier"):
        if getattr(args, kind, None):
            return kind
    raise InvalidArgument("audit needs one of --verifier, --tree-verifier, --decoder or --drafter")


def audit_argv(args) -> list[str]:
    """The canonical ``audit`` arguments of a run (without ``specverify audit`` and output options)."""
    kind, options = kind_of(args), role_options(args)
    roles = {
        "verifier": ("verifier",),
        "tree_verifier": ("tree_verifier",),
        "decoder": ("decoder", "target", "reference"),
        "drafter": ("drafter", "target", "verifier"),
    }[kind]
    argv: list[str] = []
    for role in roles:
        spec = getattr(args, role, None)
        if spec:
            argv += [_flag(role), spec]
            for key, value in options[role].items():
                argv += [f"{_flag(role)}-option", _option_text(key, value)]
    if getattr(args, "greedy", False) and kind != "drafter":
        argv.append("--greedy")
    if kind in ("verifier", "tree_verifier"):
        for name in getattr(args, "scenario", None) or ():
            argv += ["--scenario", name]
    if kind == "tree_verifier":
        for mode in getattr(args, "mode", None) or ():
            argv += ["--mode", mode]
    if kind == "decoder":
        for flag in ("num_samples", "max_new_tokens"):
            if getattr(args, flag, None) is not None:
                argv += ["--" + flag.replace("_", "-"), str(getattr(args, flag))]
    if kind == "drafter":
        for flag in ("k", "draft_cost", "model_params"):
            if getattr(args, flag, None) is not None:
                value = getattr(args, flag)
                argv += ["--" + flag.replace("_", "-"), str(value) if flag == "k" else _number(value)]
        for flag, default in (("bandwidth", DEFAULT_BANDWIDTH), ("bytes_per_param", DEFAULT_BYTES_PER_PARAM)):
            value = getattr(args, flag, default)
            if value != default or getattr(args, "model_params", None) is not None:
                argv += ["--" + flag.replace("_", "-"), _number(value)]
    for flag in ("device", "dtype"):
        if getattr(args, flag, None) is not None:
            argv += ["--" + flag, str(getattr(args, flag))]
    if getattr(args, "gate_conformance", False):
        argv.append("--gate-conformance")
    argv += _parallel_argv(args)
    argv += ["--tier", args.tier, "--seed", str(args.seed), "--alpha", _number(args.alpha)]
    return argv


def _parallel_argv(args) -> list[str]:
    """The sharding flags of a run, when not the defaults (they never change the statistics)."""
    argv: list[str] = []
    if getattr(args, "workers", None) is not None:
        argv += ["--workers", str(args.workers)]
    for flag in ("backend", "shards", "ray_address"):
        if getattr(args, flag, None) is not None:
            argv += ["--" + flag.replace("_", "-"), str(getattr(args, flag))]
    if getattr(args, "until_decisive", False):
        argv.append("--until-decisive")
    return argv


def parallel_options(args) -> dict:
    """``check_verifier``/``check_tree_verifier`` keywords of the sharding flags."""
    return dict(
        workers=getattr(args, "workers", None),
        backend=getattr(args, "backend", None),
        shards=getattr(args, "shards", None),
        ray_address=getattr(args, "ray_address", None),
        until_decisive=getattr(args, "until_decisive", False),
    )


def audit_command(args) -> str:
    """``specverify audit ...``: :func:`audit_argv` as one shell-quoted line."""
    return "specverify audit " + " ".join(shlex.quote(a) for a in audit_argv(args))


def _validate(args, kind: str) -> None:
    if kind == "drafter" and not args.target:
        raise InvalidArgument("--drafter needs --target PKG.MOD:FACTORY")
    if kind == "decoder" and not args.target and not args.reference:
        raise InvalidArgument(
            "--decoder needs --target PKG.MOD:FACTORY (exact conditionals) or --reference PKG.MOD:FACTORY (two-sample)"
        )
    misplaced = []
    if kind not in ("verifier", "tree_verifier") and getattr(args, "scenario", None):
        misplaced.append("--scenario (verifier and tree-verifier audits)")
    if kind != "tree_verifier" and getattr(args, "mode", None):
        misplaced.append("--mode (tree-verifier audits)")
    if kind == "tree_verifier" and getattr(args, "greedy", False):
        misplaced.append("--greedy (verifier and decoder audits)")
    if kind != "decoder":
        misplaced += [
            f"--{f} (decoder audits)"
            for f in ("num-samples", "max-new-tokens")
            if getattr(args, f.replace("-", "_"), None) is not None
        ]
    if kind != "drafter":
        misplaced += [
            f"--{f} (drafter audits)"
            for f in ("k", "draft-cost", "model-params")
            if getattr(args, f.replace("-", "_"), None) is not None
        ]
    if kind == "decoder" and getattr(args, "dtype", None) is not None:
        misplaced.append(
            "--dtype (verifier, tree-verifier and drafter audits: a decoder computes its own probabilities)"
        )
    if kind == "drafter" and getattr(args, "greedy", False):
        misplaced.append("--greedy (verifier and decoder audits)")
    if getattr(args, "gate_conformance", False) and (kind == "decoder" or getattr(args, "greedy", False)):
        misplaced.append(
            "--gate-conformance (sampling verifier, tree-verifier and drafter audits: they test acceptance)"
        )
    if kind in ("verifier", "tree_verifier") and getattr(args, "target", None):
        misplaced.append("--target (decoder and drafter audits)")
    if kind != "decoder" and getattr(args, "reference", None):
        misplaced.append("--reference (decoder audits)")
    flags = [flag for flag in _parallel_argv(args) if flag.startswith("--")]
    if kind == "drafter" or (kind == "verifier" and getattr(args, "greedy", False)):
        misplaced += [f"{flag} (sampling verifier, tree-verifier and decoder audits)" for flag in flags]
    elif kind == "decoder" and getattr(args, "until_decisive", False):
        misplaced.append("--until-decisive (verifier and tree-verifier audits)")
    if misplaced:
        raise InvalidArgument(f"a {kind} audit does not take " + ", ".join(misplaced))


def run_audit(args, *, progress=None):
    """Build the implementations named by parsed ``audit`` arguments, run the audit, return the Report.

    The report's ``implementation`` is the audited spec with its options and its ``command``
    is :func:`audit_command` of ``args``.  Raises :class:`~specverify.core.errors.InvalidArgument`
    (including :class:`BuildError`) on bad usage; a misbehaving implementation is reported in
    ``Report.errors`` by the audit itself.
    """
    kind = kind_of(args)
    _validate(args, kind)
    options = role_options(args)
    common = dict(
        tier=args.tier, seed=args.seed, alpha=args.alpha, progress=progress, device=getattr(args, "device", None)
    )
    if kind != "decoder":
        common["dtype"] = getattr(args, "dtype", None)
        common["gate_conformance"] = bool(getattr(args, "gate_conformance", False))
    # Each branch builds the implementations before importing its battery: a spec that does not
    # load is a usage error before torch is imported (the user's own module may import it).
    if kind == "drafter":
        verifier = build_verifier(args.verifier, options["verifier"]) if args.verifier else None
        drafter, target = (
            build(args.drafter, "drafter", options["drafter"]),
            build(args.target, "target", options["target"]),
        )
        from specverify.drafter import audit_drafter

        report = audit_drafter(
            drafter,
            target,
            verifier=verifier,
            k=args.k,
            draft_cost=args.draft_cost,
            model_params=args.model_params,
            bandwidth=args.bandwidth,
            bytes_per_param=args.bytes_per_param,
            **common,
        )
    elif kind == "decoder":
        decoder = build(args.decoder, "decoder", options["decoder"])
        target = build(args.target, "target", options["target"]) if args.target else None
        reference = build(args.reference, "reference", options["reference"]) if args.reference else None
        from specverify.decoder import check_decoder

        report = check_decoder(
            decoder,
            target,
            reference=reference,
            greedy=True if args.greedy else None,
            num_samples=args.num_samples,
            max_new_tokens=args.max_new_tokens,
            **common,
            **{k: v for k, v in parallel_options(args).items() if k != "until_decisive"},
        )
    elif kind == "tree_verifier":
        verify_tree = build_verifier(args.tree_verifier, options["tree_verifier"], role="tree_verifier")
        from specverify.verifier.tree.battery import check_tree_verifier

        report = check_tree_verifier(
            verify_tree, scenarios=args.scenario, modes=args.mode, **common, **parallel_options(args)
        )
    else:
        verify = build_verifier(args.verifier, options["verifier"])
        from specverify.verifier.battery import check_verifier

        parallel = {} if args.greedy else parallel_options(args)
        report = check_verifier(verify, greedy=args.greedy, scenarios=args.scenario, **common, **parallel)
    spec = getattr(args, kind)
    named = spec + ("(" + ", ".join(f"{k}={v!r}" for k, v in options[kind].items()) + ")" if options[kind] else "")
    return dataclasses.replace(report, implementation=named, command=audit_command(args))
