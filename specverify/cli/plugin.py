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
(:class:`SuspiciousResultWarning`); rule-conformance results (acceptance against the declared
rule, :mod:`specverify.core.conformance`) are recorded but judged only with
``--specverify-gate-conformance``.  ``specverify[protocol]`` fails on implementation errors,
on a battery that could not run and on results no scenario owns.  Statistics are recorded as
JUnit XML properties.  Skips file: lines ``xfail|skip <glob>  # reason``; the glob (``*``,
``?``; brackets literal) matches the item name or the scenario name.

Options and the skips file: :mod:`specverify.cli.plugin_settings`; failure messages:
:mod:`specverify.cli.plugin_messages`.  A report written with ``--specverify-report`` records the
``specverify audit`` command of the run (the scenario subset included), as the repro lines do.

Battery API (module ``specverify.verifier.battery``, or ``--specverify-battery MODULE``):
``list_scenarios(tier, *, greedy=False) -> list[str]`` and ``check_verifier(verify, *, tier,
seed, alpha, greedy, scenarios, progress, implementation) -> Report``.  Without
``list_scenarios`` one item ``specverify[battery]`` runs the whole battery; without the
``scenarios`` keyword every scenario runs and each item asserts its share.
"""

from __future__ import annotations

import dataclasses
import inspect
import time
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Any

import pytest

from specverify.cli.plugin_messages import describe, label, mentions
from specverify.cli.plugin_settings import DEFAULT_BATTERY, Settings, add_options, glob, read_settings, read_skips
from specverify.core.conformance import conformance_line, is_conformance
from specverify.core.results import error_groups, is_error_record

__all__ = ["SuspiciousResultWarning", "SpecverifyItem"]

MARKER = "specverify"
PROTOCOL, WHOLE, ENDPOINT = "protocol", "battery", "endpoint"  # specverify[protocol], [battery], [endpoint]
MAX_SHOWN = 8  # failing tests spelled out per item


class SuspiciousResultWarning(UserWarning):
    """A specverify test graded SUSPICIOUS: p below 100x its allocated alpha, but not a failure."""


class SpecverifyFailure(AssertionError):
    """Raised by a specverify item; its message is the whole failure report (shown without traceback)."""


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
    add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARKER}: a specverify conformance-battery item (select with -m {MARKER})")
    settings = read_settings(config)
    if settings is not None:
        from specverify.core.loading import put_on_import_path

        put_on_import_path(config.invocation_params.dir)  # mypkg/ where pytest runs, as for the CLI
        config.stash[_STATE] = State(settings)


def _state(config: pytest.Config) -> State | None:
    return config.stash.get(_STATE, None)


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    state = _state(config)
    if state is None:
        return None
    s = state.settings
    from specverify.core.version import __version__

    try:
        import torch

        version = torch.__version__
        device = "cpu" + (f" (cuda available: {torch.cuda.get_device_name(0)})" if torch.cuda.is_available() else "")
    except Exception as error:  # torch missing or broken: the battery will fail and say so
        version, device = f"unavailable ({type(error).__name__}: {error})", "?"
    return [
        f"specverify: implementation={s.impl} tier={s.tier} seed={s.seed} alpha={s.alpha:g}"
        + (" greedy" if s.greedy else ""),
        f"specverify {__version__}, torch {version}, device {device}"
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
    if s.endpoint:
        return [ENDPOINT]
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


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list) -> None:
    state = _state(config)
    if state is None:
        return
    new = []
    for suffix in [PROTOCOL, *_scenario_names(state)]:
        name = f"{MARKER}[{suffix}]"
        whole = suffix == ENDPOINT or (suffix == WHOLE and not state.scenarios)
        scenario = None if suffix == PROTOCOL else ("*" if whole else suffix)
        new.append(SpecverifyItem.from_parent(session, name=name, nodeid=name, scenario=scenario))
    if state.settings.skips:
        for action, pattern, reason, number in read_skips(config, state.settings.skips):
            regex = glob(pattern)
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


class _PluginProgress:
    """Progress through pytest's terminal reporter: a line at most every ``interval`` seconds of a long run."""

    def __init__(self, reporter, capture, interval: float = 5.0):
        self.reporter, self.capture, self.interval = reporter, capture, interval
        self.last = time.perf_counter()

    def __call__(self, done: int, total: int, name: str = "") -> None:
        from specverify.core.progress import ProgressState

        self.update(ProgressState(done, total, "done", 0, 0, name, time.perf_counter() - self.last))

    def update(self, state) -> None:
        now = time.perf_counter()
        if state.done < state.total and now - self.last >= self.interval:
            self.last = now
            running = f"; running {state.current}" if state.current else ""
            with self.capture.global_and_fixture_disabled():
                self.reporter.write_line(f"specverify: {state.describe()}{running}")


def _progress(config: pytest.Config):
    """The battery's progress callback: pytest's terminal reporter every >= 5 s (None when quiet)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or capture is None or config.get_verbosity() < 0:
        return None
    return _PluginProgress(reporter, capture)


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
        if s.endpoint:
            outcome.report = _run_endpoint(s)
            return outcome
        verify = _load_verify(s.impl)
        kwargs: dict[str, Any] = dict(tier=s.tier, seed=s.seed, alpha=s.alpha, progress=_progress(session.config))
        kwargs.update({"greedy": True} if s.greedy else {})
        if s.gate_conformance:
            if not _accepts(state.check_verifier, "gate_conformance"):
                raise pytest.UsageError(
                    f"{s.battery}.check_verifier has no 'gate_conformance' argument (--specverify-gate-conformance)"
                )
            kwargs["gate_conformance"] = True
        workers = s.workers if s.workers != 1 else None
        for key, value in (("device", s.device), ("dtype", s.dtype), ("workers", workers), ("backend", s.backend)):
            if value is not None and not _accepts(state.check_verifier, key):
                raise pytest.UsageError(f"{s.battery}.check_verifier has no {key!r} argument (--specverify-{key})")
            kwargs.update({key: value} if value is not None else {})
        if _accepts(state.check_verifier, "implementation"):
            kwargs["implementation"] = s.impl
        if subset is not None and _accepts(state.check_verifier, "scenarios"):
            kwargs["scenarios"] = list(subset)
        elif subset is not None:
            outcome.note = (
                f"{s.battery}.check_verifier has no 'scenarios' argument: all "
                f"{len(state.scenarios)} scenarios ran and were graded together"
            )
        report = state.check_verifier(verify, **kwargs)
        ran = kwargs.get("scenarios")
        if dataclasses.is_dataclass(report) and any(f.name == "command" for f in dataclasses.fields(report)):
            report = dataclasses.replace(report, command=s.audit_command(ran))  # what ran, as a CLI line
        outcome.report = report
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


def _run_endpoint(s: Settings):
    """The endpoint audit of the settings, through the CLI's own parser and runner (writes ``--out`` if given)."""
    import io

    from specverify.cli.commands import build_parser
    from specverify.cli.endpoint import run_endpoint_audit

    args = build_parser().parse_args(s.endpoint_argv())
    report = run_endpoint_audit(args, stream=io.StringIO())
    if s.report:
        from pathlib import Path

        from specverify.report import write_report

        write_report(report, Path(s.report))
    return report


# ----------------------------------------------------------------------------- messages


def _audit_command(node, settings: Settings) -> str:
    """The ``specverify audit`` line of the run (with ``--scenario`` for each scenario when a subset ran)."""
    state = _state(node.config if hasattr(node, "config") else node)
    outcome = state.outcome if state is not None else None
    ran = outcome.selected if outcome is not None and not outcome.note else None
    return settings.audit_command(ran)


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
        subject = f"endpoint {s.impl} (model {s.model})" if s.endpoint else f"verifier {s.impl}"
        head = f"{subject} (tier={s.tier}, seed={s.seed}, alpha={s.alpha:g})"
        if outcome.error is not None:
            what = "could not run" if self.scenario is None else f"{self.what} not tested: the battery could not run"
            raise SpecverifyFailure(f"{head}: {what}\n{outcome.error}\n{self._repro(s)}")
        report = outcome.report
        if self.scenario is None:  # implementation errors, results no scenario item owns, an unexplained verdict
            owned = set(state.scenarios)
            results = [r for r in report.results if r.scenario not in owned] if owned else []
            errors = [f"{g.where()}: {g.message}".lstrip(": ") for g in error_groups(report)]  # each error once
            if report.verdict == "fail" and not errors and not any(r.grade == "fail" for r in report.results):
                errors.append("verdict is 'fail' although no test failed and no implementation error was recorded")
        else:
            results = [r for r in report.results if self.scenario in ("*", r.scenario) and not is_error_record(r)]
            errors = [e for e in report.errors if self.scenario != "*" and mentions(str(e), self.scenario)]
        self._record(results, report)
        judged = [r for r in results if s.gate_conformance or not is_conformance(r)]
        self._judge(judged, errors, head, s)

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
                    self.user_properties.append((f"{label(r)}.{key}", getattr(r, key)))

    def _judge(self, results, errors, head: str, settings: Settings) -> None:
        from specverify.report.content import worst_first

        for r in results:
            if r.grade == "suspicious":  # located at the item, not at a line of the plugin
                message = f"{head}: {self.what} SUSPICIOUS (p below 100x its allocated alpha; not a failure)\n"
                warnings.warn_explicit(
                    SuspiciousResultWarning(message + describe(r, settings)), SuspiciousResultWarning, self.name, 0
                )
        failed = [r for r in worst_first(results) if r.grade == "fail"]
        if not failed and not errors:
            if not results and self.scenario not in (None, "*"):
                pytest.skip(f"the battery produced no results for scenario {self.scenario!r}")
            return
        lines = [
            f"{head}: {self.what} "
            + ("ERROR: the implementation could not be tested" if errors else "FAILED")
            + (
                f"{'; ' if errors else ': '}{len(failed)} of {len(results)} tests below their allocated alpha"
                if failed
                else ""
            )
        ]
        lines += [f"  implementation error: {e}" for e in errors]
        lines += [describe(r, settings) for r in failed[:MAX_SHOWN]]
        if len(failed) > MAX_SHOWN:
            lines.append(f"  ... and {len(failed) - MAX_SHOWN} more failing tests (all in --specverify-report DIR)")
        raise SpecverifyFailure("\n".join(lines + [self._repro(settings)]))

    def _repro(self, settings: Settings) -> str:
        return (
            f"repro: {_audit_command(self.session, settings)}\n"
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
    for group in error_groups(report):  # each error once, with the scenarios that met it
        tr.write_line(f"implementation error{group.where(prefix=' ')}: {group.message}", red=True)
    judged = [r for r in report.results if not is_error_record(r) and (s.gate_conformance or not is_conformance(r))]
    worst = worst_first(judged)
    shown = [r for r in worst if r.grade in ("fail", "suspicious")][:MAX_SHOWN] or worst[:3]
    tr.write_line("worst tests:" if shown else "no tests")
    for r in shown:
        tr.write_line("  " + r.summary())
    rule = conformance_line(report.conformance) if hasattr(report, "gate_conformance") else None
    if rule:
        tr.write_line(rule, **({"red": True} if s.gate_conformance and report.conformance.verdict == "fail" else {}))
    try:
        tr.write_line(detectability_sentence(report))
    except Exception:  # a courtesy sentence must never break the summary
        pass
    tr.write_line(
        f"repro: {_audit_command(terminalreporter.config, s)}" + (f"\nreport: {s.report}" if s.report else "")
    )
