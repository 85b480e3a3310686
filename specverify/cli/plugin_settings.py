"""Settings of the pytest plugin (:mod:`specverify.cli.plugin`): options, their sources, the skips file.

Each ``--specverify-<dest>`` option may also come from the environment (``SPECVERIFY_<DEST>``)
or the ini file (``specverify_<dest>``), in that order of precedence.  Standard library and
pytest only: nothing heavy is imported until the battery runs.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest

__all__ = [
    "DEFAULT_BATTERY",
    "OPTIONS",
    "TIERS",
    "TREE_BATTERY",
    "Settings",
    "add_options",
    "glob",
    "read_settings",
    "read_skips",
]

TIERS = ("smoke", "standard", "deep")
DEFAULT_BATTERY = "specverify.verifier.battery"
TREE_BATTERY = "specverify.verifier.tree.battery"

# dest: (default, metavar or None for a flag, help); env SPECVERIFY_<DEST>, ini specverify_<dest>
OPTIONS = {
    "impl": (
        None,
        "PKG.MOD:NAME",
        "verify(target_probs, draft_probs, draft_tokens, *, generator) to test; enables the battery",
    ),
    "tree_impl": (
        None,
        "PKG.MOD:NAME",
        f"verify_tree(target_probs, draft_probs, tokens, parents, *, mode, generator) to test with the tree "
        f"battery ({TREE_BATTERY})",
    ),
    "endpoint": (
        None,
        "URL",
        "an OpenAI-compatible server to audit over HTTP with the decoder battery (as specverify audit --endpoint)",
    ),
    "model": (None, "NAME", "the served model's name (with --specverify-endpoint)"),
    "endpoint_args": (
        None,
        "ARGS",
        "more 'specverify audit --endpoint' arguments as one string, e.g. '--temperature 0.7 --num-samples 2000'",
    ),
    "tier": ("smoke", "TIER", "battery tier: smoke | standard | deep (default smoke)"),
    "seed": ("0", "N", "root seed of the run (default 0)"),
    "alpha": ("1e-3", "A", "family-wise false-alarm rate of the selected scenarios together (default 1e-3)"),
    "skips": (None, "FILE", "file of 'skip|xfail <item glob>  # reason' lines"),
    "greedy": ("0", None, "the implementation is a greedy verifier: its output must be the argmax continuation"),
    "gate_conformance": (
        "0",
        None,
        "rule conformance (acceptance against the declared rule, graded under its own budget) also fails the "
        "items; by default they judge the output law and conformance is only reported",
    ),
    "report": (None, "DIR", "also write report.json/.md/.html of the run to DIR"),
    "device": (None, "DEVICE", "where the implementation runs: cpu (default), cuda:0, ..."),
    "dtype": (None, "DTYPE", "dtype of the probabilities handed in: float32 (default) | bfloat16 | float16"),
    "workers": ("1", "N", "run the battery's shards in N worker processes (statistics unchanged; default 1)"),
    "backend": (
        None,
        "BACKEND",
        "inline | threads (N threads; a thread-safe implementation) | processes (default for N > 1) | ray (a local Ray cluster of N CPUs)",
    ),
    "battery": (
        DEFAULT_BATTERY,
        "MODULE",
        f"module providing list_scenarios and check_verifier (default {DEFAULT_BATTERY})",
    ),
}


def add_options(parser: pytest.Parser) -> None:
    """Register every ``--specverify-<dest>`` option and its ini key."""
    group = parser.getgroup("specverify", "specverify conformance battery (speculative-decoding verifiers)")
    for dest, (_, metavar, text) in OPTIONS.items():
        flag = "--specverify-" + dest.replace("_", "-")
        text += f" [env SPECVERIFY_{dest.upper()}, ini specverify_{dest}]"
        if metavar is None:
            group.addoption(flag, action="store_true", default=None, dest=f"specverify_{dest}", help=text)
        else:
            group.addoption(flag, metavar=metavar, default=None, dest=f"specverify_{dest}", help=text)
        parser.addini(f"specverify_{dest}", f"specverify: default for {flag}", type="string", default="")


@dataclass(frozen=True)
class Settings:
    impl: str
    tier: str
    seed: int
    alpha: float
    greedy: bool
    skips: str | None
    report: str | None
    battery: str
    tree: bool = False
    device: str | None = None
    dtype: str | None = None
    workers: int = 1
    backend: str | None = None
    model: str | None = None  # set: ``impl`` is an endpoint URL audited over HTTP
    endpoint_args: str = ""
    gate_conformance: bool = False

    @property
    def endpoint(self) -> bool:
        return self.model is not None

    def endpoint_argv(self) -> list[str]:
        """The ``specverify audit`` arguments of an endpoint run (``--out`` the report directory, if any)."""
        argv = ["audit", "--endpoint", self.impl, "--model", str(self.model), *shlex.split(self.endpoint_args)]
        argv += ["--tier", self.tier, "--seed", str(self.seed), "--alpha", f"{self.alpha:g}"]
        return argv + (["--out", self.report] if self.report else [])

    def audit_command(self, scenarios=None) -> str:
        """The ``specverify audit`` line of the same run (``scenarios``: the subset that ran, if not all).

        Built by the CLI's own :func:`specverify.cli.audit.audit_command`, so it parses with the
        CLI's parser and reruns the same battery (the battery module must be the default one).
        """
        if self.endpoint:
            from specverify.cli.commands import build_parser
            from specverify.cli.endpoint import endpoint_command

            return endpoint_command(build_parser().parse_args(self.endpoint_argv()))
        from specverify.cli.audit import audit_command

        args = SimpleNamespace(
            verifier=None if self.tree else self.impl,
            verifier_option=[],
            tree_verifier=self.impl if self.tree else None,
            tree_verifier_option=[],
            greedy=self.greedy,
            scenario=list(scenarios) if scenarios else None,
            tier=self.tier,
            seed=self.seed,
            alpha=self.alpha,
            device=self.device,
            dtype=self.dtype,
            workers=self.workers if self.workers != 1 else None,  # 1, the option's default: the audit's default
            backend=self.backend,
            gate_conformance=self.gate_conformance,
        )
        return audit_command(args)

    def pytest_command(self, item_name: str) -> str:
        if self.endpoint:
            parts = [
                "pytest --specverify-endpoint",
                shlex.quote(self.impl),
                "--specverify-model",
                shlex.quote(str(self.model)),
            ]
            parts += ["--specverify-endpoint-args", shlex.quote(self.endpoint_args)] if self.endpoint_args else []
            parts += ["--specverify-tier", self.tier, "--specverify-seed", str(self.seed)]
            parts += ["--specverify-alpha", f"{self.alpha:g}"] if self.alpha != 1e-3 else []
            return " ".join(parts + ["-k", shlex.quote(item_name)])
        parts = [
            "pytest --specverify-tree-impl" if self.tree else "pytest --specverify-impl",
            shlex.quote(self.impl),
            "--specverify-tier",
            self.tier,
            "--specverify-seed",
            str(self.seed),
        ]
        parts += ["--specverify-alpha", f"{self.alpha:g}"] if self.alpha != 1e-3 else []
        parts += ["--specverify-greedy"] if self.greedy else []
        parts += ["--specverify-gate-conformance"] if self.gate_conformance else []
        parts += ["--specverify-device", shlex.quote(self.device)] if self.device else []
        parts += ["--specverify-dtype", self.dtype] if self.dtype else []
        parts += ["--specverify-workers", str(self.workers)] if self.workers != 1 else []
        parts += ["--specverify-backend", self.backend] if self.backend else []
        default = TREE_BATTERY if self.tree else DEFAULT_BATTERY
        parts += ["--specverify-battery", shlex.quote(self.battery)] if self.battery != default else []
        return " ".join(parts + ["-k", shlex.quote(item_name)])


def _raw(config: pytest.Config, dest: str) -> Any:
    value = config.getoption(f"specverify_{dest}", default=None)
    if value is None:
        value = (
            os.environ.get(f"SPECVERIFY_{dest.upper()}", "").strip()
            or str(config.getini(f"specverify_{dest}") or "").strip()
        )
    return value if value not in (None, "") else OPTIONS[dest][0]


def _number(config: pytest.Config, dest: str, kind, valid, what: str):
    text = _raw(config, dest)
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or not valid(value):
        raise pytest.UsageError(f"--specverify-{dest} must be {what}, got {text!r}")
    return value


def _switch(config: pytest.Config, dest: str) -> bool:
    """A true/false option: the flag, or 1/0, true/false, yes/no, on/off from the environment or ini file."""
    value = _raw(config, dest)
    if value is True or str(value).lower() in ("1", "true", "yes", "on"):
        return True
    if value is False or str(value).lower() in ("0", "false", "no", "off"):
        return False
    raise pytest.UsageError(
        f"--specverify-{dest.replace('_', '-')} must be 1/0, true/false, yes/no or on/off, got {value!r}"
    )


def read_settings(config: pytest.Config) -> Settings | None:
    """The run's settings, or None when no implementation is named (the plugin stays inert)."""
    impl, tree_impl, endpoint = _raw(config, "impl"), _raw(config, "tree_impl"), _raw(config, "endpoint")
    if sum(bool(x) for x in (impl, tree_impl, endpoint)) > 1:
        raise pytest.UsageError(
            "give one of --specverify-impl (a chain verifier), --specverify-tree-impl or --specverify-endpoint"
        )
    if not (impl or tree_impl or endpoint):
        return None
    if endpoint:
        return _endpoint_settings(config, str(endpoint))
    battery = str(_raw(config, "battery"))
    if tree_impl and battery == DEFAULT_BATTERY:
        battery = TREE_BATTERY
    tier = str(_raw(config, "tier"))
    if tier not in TIERS:
        raise pytest.UsageError(f"--specverify-tier must be one of {', '.join(TIERS)}, got {tier!r}")
    greedy = _raw(config, "greedy")
    device, dtype = _raw(config, "device"), _raw(config, "dtype")
    try:
        from specverify.core.devices import check_device, check_prob_dtype, dtype_name

        device = None if device is None else str(check_device("--specverify-device", str(device)))
        dtype = None if dtype is None else dtype_name(check_prob_dtype("--specverify-dtype", str(dtype)))
    except ValueError as error:  # InvalidArgument
        raise pytest.UsageError(str(error)) from None
    return Settings(
        impl=str(impl or tree_impl),
        tier=tier,
        seed=_number(config, "seed", int, lambda x: x >= 0, "a non-negative integer"),
        alpha=_number(config, "alpha", float, lambda x: 0.0 < x < 1.0, "a number in (0, 1)"),
        greedy=greedy is True or str(greedy).lower() in ("1", "true", "yes", "on"),
        skips=_raw(config, "skips"),
        report=_raw(config, "report"),
        battery=battery,
        tree=bool(tree_impl),
        device=device,
        dtype=dtype,
        workers=_number(config, "workers", int, lambda x: x >= 1, "a positive integer"),
        backend=_backend(_raw(config, "backend")),
        gate_conformance=_switch(config, "gate_conformance"),
    )


def _endpoint_settings(config: pytest.Config, endpoint: str) -> Settings:
    """Settings of an endpoint run; its arguments are checked by the CLI's own parser."""
    model = _raw(config, "model")
    if not model:
        raise pytest.UsageError("--specverify-endpoint needs --specverify-model NAME (the served model's name)")
    tier = str(_raw(config, "tier"))
    if tier not in TIERS:
        raise pytest.UsageError(f"--specverify-tier must be one of {', '.join(TIERS)}, got {tier!r}")
    settings = Settings(
        impl=endpoint,
        tier=tier,
        seed=_number(config, "seed", int, lambda x: x >= 0, "a non-negative integer"),
        alpha=_number(config, "alpha", float, lambda x: 0.0 < x < 1.0, "a number in (0, 1)"),
        greedy=False,
        skips=_raw(config, "skips"),
        report=_raw(config, "report"),
        battery="specverify.endpoint",
        model=str(model),
        endpoint_args=str(_raw(config, "endpoint_args") or ""),
    )
    import contextlib
    import io

    from specverify.cli.commands import build_parser

    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            build_parser().parse_args(settings.endpoint_argv())
    except SystemExit:
        message = stderr.getvalue().strip().splitlines()[-1:] or ["invalid arguments"]
        raise pytest.UsageError(f"--specverify-endpoint-args {settings.endpoint_args!r}: {message[0]}") from None
    return settings


def _backend(value) -> str | None:
    if value is None:
        return None
    from specverify.shard.backends import BACKENDS

    if value not in BACKENDS:
        raise pytest.UsageError(f"--specverify-backend must be one of {', '.join(BACKENDS)}, got {value!r}")
    return str(value)


def glob(pattern: str) -> re.Pattern:
    """``*`` and ``?`` are wildcards; everything else (brackets included) is literal."""
    return re.compile(re.escape(pattern).replace(r"\*", ".*").replace(r"\?", "."), re.IGNORECASE | re.DOTALL)


def read_skips(config: pytest.Config, path: str) -> list[tuple[str, str, str, int]]:
    """(action, pattern, reason, line number) per directive; a relative path is tried in the
    invocation directory, then in the rootdir."""
    from pathlib import Path

    found = [d / path for d in (config.invocation_params.dir, config.rootpath) if (d / path).is_file()]
    try:
        lines = (found[0] if found else Path(path)).read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise pytest.UsageError(f"--specverify-skips {path!r}: cannot read it ({error})") from None
    directives = []
    for number, line in enumerate(lines, 1):
        text, _, comment = line.partition("#")
        words = text.split()
        if not words:
            continue
        if len(words) != 2 or words[0].lower() not in ("skip", "xfail"):
            raise pytest.UsageError(
                f"--specverify-skips {path}:{number}: expected 'skip <glob>' or 'xfail <glob>' "
                f"(optionally '# reason'), got {line.strip()!r}"
            )
        reason = comment.strip() or f"{words[0].lower()} in {os.path.basename(path)}:{number}"
        directives.append((words[0].lower(), words[1], reason, number))
    return directives
