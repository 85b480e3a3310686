"""pytest plugin: the verifier conformance battery as ordinary, selectable pytest tests.

Loaded through the ``pytest11`` entry point.  ``pytest --specverify-impl PKG.MOD:NAME``
[``--specverify-tier/-seed/-alpha/-skips/-greedy/-report``]; each option may also come from
the environment (``SPECVERIFY_IMPL``, ...) or the ini file (``specverify_impl = ...``), in that
order of precedence.  Without an implementation the plugin is inert: no items, nothing
imported beyond the standard library and pytest (no torch, no scipy at start-up).

Items ``specverify[<scenario>]`` and ``specverify[protocol]`` are added by a ``tryfirst``
``pytest_collection_modifyitems`` with the session as parent (like pytest-mypy's status
item), so ``-k``/``-m specverify`` and skips apply.  The battery runs once, lazily, for the
selected, not skipped scenarios: the family-wise budget (weighted Holm at ``alpha``) is spent
over them together.  An item fails on its scenario's FAIL results (observed vs expected,
statistic, p, adjusted p, N, seed, repro commands) and warns on SUSPICIOUS ones
(:class:`SuspiciousResultWarning`).  ``specverify[protocol]`` fails on implementation errors,
on a battery that could not run and on results no scenario owns.  Statistics are recorded as
JUnit XML properties.  Skips file: lines ``xfail|skip <glob>  # reason``; the glob (``*``,
``?``; brackets literal) matches the item name or the scenario name.

Battery API (module ``specverify.verifier.battery``, or ``--specverify-battery MODULE``):
``list_scenarios(tier, *, greedy=False) -> list[str]`` and ``check_verifier(verify, *, tier,
seed, alpha, greedy, scenarios, progress, implementation) -> Report``.  Without
``list_scenarios`` one item ``specverify[battery]`` runs the whole battery; without the
``scenarios`` keyword every scenario runs and each item asserts its share.
"""

from __future__ import annotations

import inspect
import os
import re
import shlex
import time
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Any

import pytest

__all__ = ["SuspiciousResultWarning", "SpecverifyItem"]

TIERS = ("smoke", "standard", "deep")
MARKER = "specverify"
PROTOCOL, WHOLE = "protocol", "battery"  # item names specverify[protocol], specverify[battery]
DEFAULT_BATTERY = "specverify.verifier.battery"
MAX_SHOWN = 8  # failing tests spelled out per item

# dest: (default, metavar or None for a flag, help); env SPECVERIFY_<DEST>, ini specverify_<dest>
_OPTIONS = {
    "impl": (
        None,
        "PKG.MOD:NAME",
        "verify(target_probs, draft_probs, draft_tokens, *, generator) to test; enables the battery",
    ),
    "tier": ("smoke", "TIER", "battery tier: smoke | standard | deep (default smoke)"),
    "seed": ("0", "N", "root seed of the run (default 0)"),
    "alpha": ("1e-3", "A", "family-wise false-alarm rate of the selected scenarios together (default 1e-3)"),
    "skips": (None, "FILE", "file of 'skip|xfail <item glob>  # reason' lines"),
    "greedy": ("0", None, "the implementation is a greedy verifier: its output must be the argmax continuation"),
    "report": (None, "DIR", "also write report.json/.md/.html of the run to DIR"),
    "battery": (
        DEFAULT_BATTERY,
        "MODULE",
        f"module providing list_scenarios and check_verifier (default {DEFAULT_BATTERY})",
    ),
}


class SuspiciousResultWarning(UserWarning):
    """A specverify test graded SUSPICIOUS: p below 100x its allocated alpha, but not a failure."""


class SpecverifyFailure(AssertionError):
    """Raised by a specverify item; its message is the whole failure report (shown without traceback)."""


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

    def audit_command(self) -> str:
        parts = ["specverify audit --verifier", shlex.quote(self.impl), "--tier", self.tier, "--seed", str(self.seed)]
        parts += ["--alpha", f"{self.alpha:g}"] if self.alpha != 1e-3 else []
        return " ".join(parts + (["--greedy"] if self.greedy else []))

    def pytest_command(self, item_name: str) -> str:
        parts = [
            "pytest --specverify-impl",
            shlex.quote(self.impl),
            "--specverify-tier",
            self.tier,
            "--specverify-seed",
            str(self.seed),
        ]
        parts += ["--specverify-alpha", f"{self.alpha:g}"] if self.alpha != 1e-3 else []
        parts += ["--specverify-greedy"] if self.greedy else []
        parts += ["--specverify-battery", shlex.quote(self.battery)] if self.battery != DEFAULT_BATTERY else []
        return " ".join(parts + ["-k", shlex.quote(item_name)])


@dataclass
class Outcome:
    """What the one battery run produced, or why it did not run."""

    report: Any = None  # specverify.core.results.Report
    error: str | None = None
    selected: tuple[str, ...] | None = None  # the scenarios asked for (None: all)
    note: str = ""
    seconds: float = 0.0


@dataclass
class State:
    settings: Settings
    scenarios: tuple[str, ...] = ()  # every scenario of the tier, in the battery's order
    check_verifier: Any = None
    collect_error: str | None = None
    outcome: Outcome | None = None
    unmatched: list[str] = field(default_factory=list)


_STATE = pytest.StashKey[State]()


# ----------------------------------------------------------------------------- options


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("specverify", "specverify conformance battery (speculative-decoding verifiers)")
    for dest, (_, metavar, text) in _OPTIONS.items():
        text += f" [env SPECVERIFY_{dest.upper()}, ini specverify_{dest}]"
        if metavar is None:
            group.addoption(f"--specverify-{dest}", action="store_true", default=None, help=text)
        else:
            group.addoption(f"--specverify-{dest}", metavar=metavar, default=None, help=text)
        parser.addini(f"specverify_{dest}", f"specverify: default for --specverify-{dest}", type="string", default="")


def _raw(config: pytest.Config, dest: str) -> Any:
    value = config.getoption(f"specverify_{dest}", default=None)
    if value is None:
        value = (
            os.environ.get(f"SPECVERIFY_{dest.upper()}", "").strip()
            or str(config.getini(f"specverify_{dest}") or "").strip()
        )
    return value if value not in (None, "") else _OPTIONS[dest][0]


def _number(config: pytest.Config, dest: str, kind, valid, what: str):
    text = _raw(config, dest)
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or not valid(value):
        raise pytest.UsageError(f"--specverify-{dest} must be {what}, got {text!r}")
    return value


def _settings(config: pytest.Config) -> Settings | None:
    impl = _raw(config, "impl")
    if not impl:
        return None
    tier = str(_raw(config, "tier"))
    if tier not in TIERS:
        raise pytest.UsageError(f"--specverify-tier must be one of {', '.join(TIERS)}, got {tier!r}")
    greedy = _raw(config, "greedy")
    return Settings(
        impl=str(impl),
        tier=tier,
        seed=_number(config, "seed", int, lambda x: x >= 0, "a non-negative integer"),
        alpha=_number(config, "alpha", float, lambda x: 0.0 < x < 1.0, "a number in (0, 1)"),
        greedy=greedy is True or str(greedy).lower() in ("1", "true", "yes", "on"),
        skips=_raw(config, "skips"),
        report=_raw(config, "report"),
        battery=str(_raw(config, "battery")),
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARKER}: a specverify conformance-battery item (select with -m {MARKER})")
    settings = _settings(config)
    if settings is not None:
        config.stash[_STATE] = State(settings)


def _state(config: pytest.Config) -> State | None:
    return config.stash.get(_STATE, None)


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    state = _state(config)
    if state is None:
        return None
    s = state.settings
    import specverify

    try:
        import torch

        version = torch.__version__
        device = "cpu" + (f" (cuda available: {torch.cuda.get_device_name(0)})" if torch.cuda.is_available() else "")
    except Exception as error:  # torch missing or broken: the battery will fail and say so
        version, device = f"unavailable ({type(error).__name__}: {error})", "?"
    return [
        f"specverify: implementation={s.impl} tier={s.tier} seed={s.seed} alpha={s.alpha:g}"
        + (" greedy" if s.greedy else ""),
        f"specverify {specverify.__version__}, torch {version}, device {device}"
        + (f", battery module {s.battery}" if s.battery != DEFAULT_BATTERY else ""),
    ]


# ----------------------------------------------------------------------------- collection


def _accepts(func, name: str) -> bool:
    try:
        params = inspect.signature(func).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def _scenario_names(state: State) -> list[str]:
    """The battery's scenario names for the tier; ``[WHOLE]`` when it cannot list them; [] if it is unusable."""
    import importlib

    s = state.settings
    try:
        battery = importlib.import_module(s.battery)
        state.check_verifier = battery.check_verifier
    except Exception as error:  # ImportError, AttributeError, or a broken battery module
        state.collect_error = f"cannot load the battery ({s.battery}.check_verifier): {type(error).__name__}: {error}"
        return []
    list_scenarios = getattr(battery, "list_scenarios", None)
    if list_scenarios is None:
        return [WHOLE]
    try:
        kwargs = {"greedy": True} if s.greedy and _accepts(list_scenarios, "greedy") else {}
        state.scenarios = tuple(str(name) for name in list_scenarios(s.tier, **kwargs))
    except Exception as error:
        state.collect_error = f"{s.battery}.list_scenarios({s.tier!r}) raised {type(error).__name__}: {error}"
        return []
    return list(state.scenarios)


def _glob(pattern: str) -> re.Pattern:
    """``*`` and ``?`` are wildcards; everything else (brackets included) is literal."""
    return re.compile(re.escape(pattern).replace(r"\*", ".*").replace(r"\?", "."), re.IGNORECASE | re.DOTALL)


def _read_skips(config: pytest.Config, path: str) -> list[tuple[str, str, str, int]]:
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


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list) -> None:
    state = _state(config)
    if state is None:
        return
    new = []
    for suffix in [PROTOCOL, *_scenario_names(state)]:
        name = f"{MARKER}[{suffix}]"
        scenario = None if suffix == PROTOCOL else ("*" if suffix == WHOLE and not state.scenarios else suffix)
        new.append(SpecverifyItem.from_parent(session, name=name, nodeid=name, scenario=scenario))
    if state.settings.skips:
        for action, pattern, reason, number in _read_skips(config, state.settings.skips):
            regex = _glob(pattern)
            hits = [it for it in new if regex.fullmatch(it.name) or (it.scenario and regex.fullmatch(it.scenario))]
            if not hits:
                state.unmatched.append(f"{state.settings.skips}:{number}: {pattern!r} matches no specverify item")
            mark = (
                pytest.mark.skip(reason=reason) if action == "skip" else pytest.mark.xfail(reason=reason, strict=False)
            )
            for it in hits:
                it.add_marker(mark)
    items.extend(new)
    # counted as collected ("collected N items", --collect-only), as if a collector had produced them
    config.hook.pytest_collectreport(report=pytest.CollectReport(MARKER, "passed", None, new))


# ----------------------------------------------------------------------------- running


def _load_verify(spec: str):
    from specverify.core.errors import InvalidArgument
    from specverify.core.loading import load_object

    obj = load_object(spec, argument="--specverify-impl")
    if hasattr(obj, "verify") and not isinstance(obj, type):
        return obj.verify
    if not callable(obj) or isinstance(obj, type):
        raise InvalidArgument(
            f"--specverify-impl {spec!r} is not a verify callable (a function, or an instance with .verify)"
        )
    return obj


def _progress(config: pytest.Config):
    """``progress(done, total, name)`` printing through the terminal reporter every >= 5 s of a long run."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or capture is None or config.get_verbosity() < 0:
        return None
    start = last = time.perf_counter()

    def progress(done: int, total: int, name: str = "") -> None:
        nonlocal last
        now = time.perf_counter()
        if done < total and now - last >= 5.0:
            last = now
            with capture.global_and_fixture_disabled():
                reporter.write_line(f"specverify: {done}/{total} scenarios done, {now - start:.0f} s, next {name}")

    return progress


def _run(session: pytest.Session, state: State) -> Outcome:
    """Run the battery once, for the selected and not skipped scenario items."""
    if state.outcome is not None:
        return state.outcome
    s = state.settings
    selected = {
        it.scenario
        for it in session.items
        if isinstance(it, SpecverifyItem) and it.scenario not in (None, "*") and it.get_closest_marker("skip") is None
    }
    # in the battery's order, so that the run does not depend on item order (-p randomly, ...)
    subset = (
        tuple(n for n in state.scenarios if n in selected) if selected and selected != set(state.scenarios) else None
    )
    outcome = state.outcome = Outcome(selected=subset)
    start = time.perf_counter()
    try:
        if state.collect_error:
            outcome.error = state.collect_error
            return outcome
        verify = _load_verify(s.impl)
        kwargs: dict[str, Any] = dict(tier=s.tier, seed=s.seed, alpha=s.alpha, progress=_progress(session.config))
        kwargs.update({"greedy": True} if s.greedy else {})
        if _accepts(state.check_verifier, "implementation"):
            kwargs["implementation"] = s.impl
        if subset is not None and _accepts(state.check_verifier, "scenarios"):
            kwargs["scenarios"] = list(subset)
        elif subset is not None:
            outcome.note = (
                f"{s.battery}.check_verifier has no 'scenarios' argument: all "
                f"{len(state.scenarios)} scenarios ran and were graded together"
            )
        outcome.report = state.check_verifier(verify, **kwargs)
        if s.report:
            from pathlib import Path

            from specverify.report import write_report

            write_report(outcome.report, Path(s.report))
    except Exception as error:
        from specverify.core.errors import SpecVerifyError

        if isinstance(error, SpecVerifyError):
            outcome.error = f"{type(error).__name__}: {error}"
        else:
            outcome.error = "the battery raised:\n" + "".join(
                traceback.format_exception(type(error), error, error.__traceback__)
            )
    finally:
        outcome.seconds = time.perf_counter() - start
    return outcome


# ----------------------------------------------------------------------------- messages


def _label(result) -> str:
    name = result.family if result.name in ("", result.family) else f"{result.family}/{result.name}"
    return f"{name}@{result.position}" if result.position else name


def _observed_vs_expected(result, limit: int = 3) -> str:
    """The deviation in the units of the test: worst bins, offending tokens, score sums, PIT means, counts."""
    import math

    from specverify.report.content import bin_label, counts_of, fmt

    d = result.details if hasattr(result.details, "get") else {}
    if result.family == "support" and (d.get("pairs") or d.get("tokens")):
        return f"emitted tokens of target probability 0: {list(d.get('pairs') or d.get('tokens'))[:5]}"
    for key, what in (("error", "protocol violation"), ("first", "first mismatch")):
        if d.get(key):
            return f"{what}: {d[key]}"
    counts = counts_of(result)
    if counts is not None:
        observed, expected, tokens = counts
        z = [(o - e) / math.sqrt(e) if e > 0 else math.inf for o, e in zip(observed, expected)]
        worst = sorted(range(len(z)), key=lambda i: -abs(z[i]))[:limit]
        return "; ".join(
            f"{'token ' if tokens[i] is not None else ''}{bin_label(tokens[i], i)}: "
            f"{fmt(observed[i], '.6g')} vs {fmt(expected[i], '.6g')} (z={z[i]:+.1f})"
            for i in worst
        )
    if "sum" in d and "variance" in d:
        return f"sum of scores {fmt(d['sum'], '.4g')} vs 0 (sd {fmt(math.sqrt(max(float(d['variance']), 0.0)), '.4g')})"
    if "mean" in d and "ks_critical" in d:
        return (
            f"mean PIT {fmt(d['mean'], '.4g')} vs 0.5; KS distance {fmt(result.statistic, '.4g')} "
            f"vs critical {fmt(d['ks_critical'], '.4g')}"
        )
    pairs = [
        (str(k)[len("observed") :], k) for k in d if str(k).startswith("observed") and f"expected{str(k)[8:]}" in d
    ]
    text = "; ".join(
        f"{suffix.strip('_') + ' ' if suffix else ''}{fmt(d[k], '.6g')} vs {fmt(d['expected' + suffix], '.6g')}"
        for suffix, k in pairs[:limit]
    )
    return text or "see the report's details"


def _describe(result, settings: Settings) -> str:
    from specverify.report.content import fmt

    seed = result.details.get("seed", settings.seed) if hasattr(result.details, "get") else settings.seed
    extras = "".join(
        f", {k}={fmt(v)}"
        for k, v in (("df", result.df), ("bins", result.bins), ("detectable TV", result.mde_tv))
        if v is not None
    )
    return (
        f"  {_label(result)} [{(result.grade or '?').upper()}] ({result.method})\n"
        f"    observed vs expected: {_observed_vs_expected(result)}\n"
        f"    statistic={fmt(result.statistic, '.4g')}, p={fmt(result.pvalue)}, adjusted p={fmt(result.adjusted_pvalue)}"
        f" (allocated alpha {fmt(result.alpha)}), N={result.n}{extras}, seed={seed}"
    )


def _mentions(text: str, scenario: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(scenario)}(?![\w-])", text) is not None


class SpecverifyItem(pytest.Item):
    """A battery scenario (``scenario``: its name; ``"*"``: the whole battery) or the protocol item (None)."""

    def __init__(self, *, scenario: str | None, **kwargs):
        super().__init__(**kwargs)
        self.scenario = scenario
        self.add_marker(MARKER)

    @property
    def what(self) -> str:
        return {None: "protocol", "*": "the whole battery"}.get(self.scenario, f"scenario {self.scenario!r}")

    def reportinfo(self):
        # "specverify[x]" in -rs and --durations lines; skip reports require a line number
        return self.path / self.name, 0, self.name

    def runtest(self) -> None:
        state = _state(self.config)
        outcome, s = _run(self.session, state), state.settings
        head = f"verifier {s.impl} (tier={s.tier}, seed={s.seed}, alpha={s.alpha:g})"
        if outcome.error is not None:
            what = "could not run" if self.scenario is None else f"{self.what} not tested: the battery could not run"
            raise SpecverifyFailure(f"{head}: {what}\n{outcome.error}\n{self._repro(s)}")
        report = outcome.report
        if self.scenario is None:  # implementation errors, results no scenario item owns, an unexplained verdict
            owned = set(state.scenarios)
            results = [r for r in report.results if r.scenario not in owned] if owned else []
            errors = list(report.errors)
            if report.verdict == "fail" and not errors and not any(r.grade == "fail" for r in report.results):
                errors.append("verdict is 'fail' although no test failed and no implementation error was recorded")
        else:
            results = [r for r in report.results if self.scenario in ("*", r.scenario)]
            errors = [e for e in report.errors if self.scenario != "*" and _mentions(str(e), self.scenario)]
        self._record(results, report)
        self._judge(results, errors, head, s)

    def _record(self, results, report) -> None:
        """JUnit XML properties: the run, then statistic/pvalue/adjusted_pvalue/n/mde_tv/grade per test."""
        s = _state(self.config).settings
        self.user_properties += [
            ("specverify.implementation", s.impl),
            ("specverify.tier", s.tier),
            ("specverify.seed", s.seed),
            ("specverify.alpha", s.alpha),
            ("specverify.verdict", report.verdict),
        ]
        for r in results:
            for key in ("statistic", "pvalue", "adjusted_pvalue", "n", "mde_tv", "grade"):
                if getattr(r, key) is not None:
                    self.user_properties.append((f"{_label(r)}.{key}", getattr(r, key)))

    def _judge(self, results, errors, head: str, settings: Settings) -> None:
        from specverify.report.content import worst_first

        for r in results:
            if r.grade == "suspicious":  # located at the item, not at a line of the plugin
                message = f"{head}: {self.what} SUSPICIOUS (p below 100x its allocated alpha; not a failure)\n"
                warnings.warn_explicit(
                    SuspiciousResultWarning(message + _describe(r, settings)), SuspiciousResultWarning, self.name, 0
                )
        failed = [r for r in worst_first(results) if r.grade == "fail"]
        if not failed and not errors:
            if not results and self.scenario not in (None, "*"):
                pytest.skip(f"the battery produced no results for scenario {self.scenario!r}")
            return
        lines = [
            f"{head}: {self.what} FAILED"
            + (f": {len(failed)} of {len(results)} tests below their allocated alpha" if failed else "")
        ]
        lines += [f"  implementation error: {e}" for e in errors]
        lines += [_describe(r, settings) for r in failed[:MAX_SHOWN]]
        if len(failed) > MAX_SHOWN:
            lines.append(f"  ... and {len(failed) - MAX_SHOWN} more failing tests (all in --specverify-report DIR)")
        raise SpecverifyFailure("\n".join(lines + [self._repro(settings)]))

    def _repro(self, settings: Settings) -> str:
        return (
            f"repro: {settings.audit_command()}\n"
            f"       {settings.pytest_command(self.name)}   (alone: its own error budget)"
        )

    def repr_failure(self, excinfo, style=None):
        if excinfo.errisinstance(SpecverifyFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)


# ----------------------------------------------------------------------------- summary


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    state = _state(config)
    if state is None:
        return
    tr, s, outcome = terminalreporter, state.settings, state.outcome
    for message in state.unmatched:
        tr.write_line(f"specverify: warning: skips file {message}", yellow=True)
    if outcome is None:
        return
    tr.write_sep("=", "specverify")
    if outcome.error is not None:
        last = [line for line in outcome.error.splitlines() if line.strip()][-1]
        tr.write_line(f"verifier {s.impl}: the battery did not run: {last.strip()}", red=True)
        return
    from specverify.report.content import detectability_sentence, worst_first

    report = outcome.report
    colour = {"pass": {"green": True}, "suspicious": {"yellow": True}}.get(report.verdict, {"red": True})
    scenarios = (
        len(outcome.selected) if outcome.selected is not None else (len(state.scenarios) or len(report.scenarios))
    )
    tr.write_line(
        f"verifier {s.impl}: {report.verdict.upper()} (tier {s.tier}, seed {s.seed}, alpha {s.alpha:g}, "
        f"{scenarios} scenarios, {len(report.results)} tests graded together, {outcome.seconds:.1f} s)",
        **colour,
    )
    if outcome.note:
        tr.write_line(f"note: {outcome.note}")
    for error in report.errors:
        tr.write_line(f"implementation error: {error}", red=True)
    worst = worst_first(report.results)
    shown = [r for r in worst if r.grade in ("fail", "suspicious")][:MAX_SHOWN] or worst[:3]
    tr.write_line("worst tests:" if shown else "no tests")
    for r in shown:
        tr.write_line("  " + r.summary())
    try:
        tr.write_line(detectability_sentence(report))
    except Exception:  # a courtesy sentence must never break the summary
        pass
    tr.write_line(f"repro: {s.audit_command()}" + (f"\nreport: {s.report}" if s.report else ""))
