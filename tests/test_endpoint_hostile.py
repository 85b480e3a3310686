"""The endpoint client against a hostile server: every misbehaviour of ``specverify.endpoint.hostile``.

One local server process plays them all (``/hostile/KIND/N/RUN/v1``), with a second origin, the
collector, that records any ``Authorization`` header reaching it.  Each class of the threat model
(docs/endpoint.md) has its test, parametrized over the class's misbehaviours, and every run is held
to the same contract: exit 2 with one line naming the fault (or, for transient faults and
harmless extras, a finished audit whose statistics equal a clean run's), no traceback, no
control character on the terminal, the API key in no output and at no other origin, resident
memory within :data:`MEMORY_BOUND` of where it started, and a store that still reads.  The audits
run in this process (``specverify.cli.main``), so that the peak resident memory of one audit is
read from ``/proc/self/status`` after ``/proc/self/clear_refs`` resets it.
"""

from __future__ import annotations

import json
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _servers import Server

from specverify.cli import main
from specverify.endpoint.api import sampling_reply_bytes, teacher_forcing_reply_bytes
from specverify.endpoint.hostile import CLASSES, MISBEHAVIOURS
from specverify.endpoint.http import EndpointError, HttpClient
from specverify.endpoint.store import STORE_NAME, read_store

SECRET = "sk-hostile-" + secrets.token_hex(12)
#: Small audits: 60 continuations of 2 tokens per prompt, 30 per request; one retry, short timeouts.
FAST = ["--num-samples", "60", "--max-new-tokens", "2", "--samples-per-request", "30", "--retries", "1",
        "--request-timeout", "2", "--read-timeout", "0.5", "--no-plots"]  # fmt: skip
#: How much the resident memory of the process may grow during an audit refused for a reply held
#: to the cap of a sampling request here (about 1 MiB): the reply at most twice, and 16 MiB of the audit's own.
MEMORY_BOUND = 2 * sampling_reply_bytes(30, 2) + (16 << 20)


def _kinds(klass: str) -> list[str]:
    return [m.name for m in MISBEHAVIOURS.values() if m.klass == klass]


def test_every_misbehaviour_has_a_class_and_a_test():
    assert {m.klass for m in MISBEHAVIOURS.values()} == set(CLASSES)
    assert all(m.expect in ("refused", "recovers", "ignored") for m in MISBEHAVIOURS.values())
    assert all(m.phrase for m in MISBEHAVIOURS.values() if m.expect == "refused")


@pytest.fixture(scope="module")
def hostile():
    server = Server("--max-logprobs", "-1")
    yield server
    server.close()


@pytest.fixture
def key(monkeypatch):
    monkeypatch.setenv("SPECVERIFY_API_KEY", SECRET)
    return SECRET


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise LookupError(field)


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        return True
    except OSError:
        return False


class Audit:
    """One in-process ``specverify audit --endpoint``: status, terminal, peak memory growth, time, files."""

    def __init__(self, capsys, url: str, out: Path, *extra: str):
        measured = _reset_peak()
        start_rss = _status_kib("VmRSS")
        t0 = time.perf_counter()
        self.status = main(["audit", "--endpoint", url, "--model", "tiny-reference", *FAST, "--out", str(out), *extra])
        self.seconds = time.perf_counter() - t0
        self.growth = (_status_kib("VmHWM") - start_rss) * 1024 if measured else None
        captured = capsys.readouterr()
        self.out, self.err, self.dir = captured.out, captured.err, out

    @property
    def said(self) -> list[str]:
        """What the terminal said beyond the plan and progress lines."""
        return [line for line in self.err.splitlines() if line and not line.startswith(("[", "will send"))]

    def report(self) -> dict:
        return json.loads((self.dir / "report.json").read_text())


def _statistics(report: dict) -> list:
    return [(r["family"], r["scenario"], r["position"], r["statistic"], r["pvalue"]) for r in report["results"]]


@pytest.fixture(scope="module")
def clean(hostile, tmp_path_factory):
    """The same audit against the well-behaved server: the statistics every finished audit must give."""
    out = tmp_path_factory.mktemp("clean")
    status = main(["audit", "--endpoint", hostile.url, "--model", "tiny-reference", *FAST, "--out", str(out)])
    assert status == 0
    return _statistics(json.loads((out / "report.json").read_text()))


def _contained(run: Audit, hostile: Server, kind: str, clean: list) -> None:
    """The contract every run keeps, whatever the server did (see the module docstring)."""
    misbehaviour = MISBEHAVIOURS[kind]
    text = run.out + run.err
    assert "Traceback" not in text
    assert all(c.isprintable() or c in "\r\n\t" for c in text), repr(text[-300:])
    if misbehaviour.expect == "refused":
        assert run.status == 2, text[-2000:]
        assert len(run.said) == 1 and run.said[0].startswith("specverify: error: "), run.said
        assert misbehaviour.phrase in run.said[0], run.said[0]
    else:
        assert run.status == 0, text[-2000:]
        assert _statistics(run.report()) == clean
        if misbehaviour.expect == "recovers":
            assert run.report()["extra"]["endpoint"]["retried"] > 0
    assert SECRET not in text
    for path in run.dir.iterdir():
        assert SECRET.encode() not in path.read_bytes(), path.name
    if (run.dir / STORE_NAME).exists():
        read_store(run.dir / STORE_NAME)  # still reads: unchanged or resumable
    seen = hostile.log()["seen"]
    assert not any(SECRET in header for header in seen["collector"]), "the key left its origin"
    assert f"Bearer {SECRET}" in seen["origin"]  # the key did travel where it belongs (the check can see it)
    if run.growth is not None:
        assert run.growth <= MEMORY_BOUND, f"resident memory grew by {run.growth / 2**20:.0f} MiB"


def _audit(capsys, hostile, tmp_path, kind: str, after: int = 0) -> Audit:
    return Audit(capsys, hostile.hostile(kind, after, run=f"{kind}-{tmp_path.name}"), tmp_path / "out")


@pytest.mark.parametrize("kind", _kinds("credentials"))
def test_credentials_never_leave_their_origin(hostile, clean, capsys, tmp_path, key, kind):
    run = _audit(capsys, hostile, tmp_path, kind)
    _contained(run, hostile, kind, clean)
    if kind != "echo-key-in-reply":
        assert "[redacted]" in run.said[0] or "redirect" in run.said[0]


@pytest.mark.parametrize("kind", _kinds("size"))
def test_a_reply_cannot_make_the_client_hold_more_than_its_cap(hostile, clean, capsys, tmp_path, key, kind):
    run = _audit(capsys, hostile, tmp_path, kind)
    _contained(run, hostile, kind, clean)
    assert run.seconds < 10


@pytest.mark.parametrize("kind", _kinds("time"))
def test_a_reply_cannot_make_the_client_wait_longer_than_its_timeouts(hostile, clean, capsys, tmp_path, key, kind):
    run = _audit(capsys, hostile, tmp_path, kind)
    _contained(run, hostile, kind, clean)
    # two attempts of at most the request timeout (2 s), a backoff of 0.5 s, and the audit's own start
    assert run.seconds < 2 * 2 + 0.5 + 3, run.seconds


@pytest.mark.parametrize("kind", _kinds("content"))
def test_a_reply_the_audit_cannot_use_is_refused_in_one_line(hostile, clean, capsys, tmp_path, key, kind):
    run = _audit(capsys, hostile, tmp_path, kind)
    _contained(run, hostile, kind, clean)


@pytest.mark.parametrize("kind", _kinds("transient"))
def test_transient_faults_are_retried_and_change_nothing(hostile, clean, capsys, tmp_path, key, kind):
    run = _audit(capsys, hostile, tmp_path, kind)
    _contained(run, hostile, kind, clean)


@pytest.mark.parametrize("kind", ["echo-key", "endless-chunked", "stall", "nan-logprob", "out-of-range-token"])
def test_a_fault_in_the_middle_leaves_a_store_that_resumes(hostile, clean, capsys, tmp_path, key, kind):
    """Six good replies, then the fault: exit 2, the six kept; once the server behaves, the same command finishes."""
    run_id = f"mid-{kind}-{tmp_path.name}"
    url = hostile.hostile(kind, 6, run=run_id)
    first = Audit(capsys, url, tmp_path / "out")
    _contained(first, hostile, kind, clean)
    kept = read_store(tmp_path / "out" / STORE_NAME).records
    assert len(kept) >= 4  # the probes are not stored; the good replies before the fault are
    hostile.heal(run_id)
    again = Audit(capsys, url, tmp_path / "out")
    assert again.status == 0, again.err[-2000:]
    endpoint = again.report()["extra"]["endpoint"]
    assert endpoint["requests_in_store_at_start"] == len(kept)
    assert _statistics(again.report()) == clean


def test_the_worst_reply_is_cut_at_the_largest_cap(hostile, clean, capsys, tmp_path, key):
    """The vocabulary probe may bring a row of up to 2^20 tokens (129 MiB); an endless reply stops there."""
    cap = teacher_forcing_reply_bytes(2, None)
    run = _audit(
        capsys, hostile, tmp_path, "endless-chunked", after=1
    )  # the sampling probe passes, then the vocabulary probe
    assert run.status == 2 and f"{cap:,} bytes" in run.said[0], run.said
    if run.growth is not None:
        assert run.growth <= 2 * cap + (64 << 20), f"resident memory grew by {run.growth / 2**20:.0f} MiB"


# ----------------------------------------------------------------------------------- TLS and where the key goes
@pytest.fixture(scope="module")
def tls_server(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    where = tmp_path_factory.mktemp("tls")
    cert, private = where / "cert.pem", where / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(private), "-out", str(cert),
         "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    server = Server("--max-logprobs", "-1", "--tls-cert", str(cert), "--tls-key", str(private))
    yield server, cert
    server.close()


def test_tls_certificates_are_verified(tls_server, capsys, tmp_path, key, monkeypatch):
    server, cert = tls_server
    assert server.url.startswith("https://")
    refused = Audit(capsys, server.url, tmp_path / "refused")
    assert refused.status == 2 and "TLS certificate not trusted" in refused.said[0], refused.said
    assert (
        f"Bearer {SECRET}" not in server.log()["seen"]["origin"]
    )  # nothing was sent before the certificate was checked
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # the user's own trust store
    trusted = Audit(capsys, server.url, tmp_path / "trusted")
    assert trusted.status == 0, trusted.err[-2000:]
    assert f"Bearer {SECRET}" in server.log()["seen"]["origin"]


@pytest.mark.parametrize(
    "url, options, why",
    [
        ("http://10.1.2.3:8000", {}, "over plain http"),
        ("https://10.1.2.3:8000", {"verify_tls": False}, "without certificate verification"),
        ("http://user:pw@127.0.0.1:8000", {}, "user name or password"),
        ("http://127.0.0.1:8000/v1?x=1", {}, "query or fragment"),
        ("ftp://127.0.0.1", {}, "http(s)://host"),
    ],
)
def test_the_key_is_refused_where_it_could_be_read(key, url, options, why):
    with pytest.raises(EndpointError, match=why.replace("(", r"\(").replace(")", r"\)")):
        HttpClient(url, **options)


def test_the_key_may_go_over_http_when_the_user_says_so_and_never_without_a_key(key, monkeypatch):
    assert HttpClient("http://10.1.2.3:8000", send_key_over_http=True).origin == ("http", "10.1.2.3", 8000)
    monkeypatch.delenv("SPECVERIFY_API_KEY")
    assert HttpClient("http://10.1.2.3:8000")._headers().get("Authorization") is None


def test_a_key_that_cannot_be_a_header_is_refused_without_showing_it(monkeypatch):
    monkeypatch.setenv("SPECVERIFY_API_KEY", "sk-abc\r\nX-Injected: 1")
    with pytest.raises(EndpointError, match="control or non-ASCII") as error:
        HttpClient("http://127.0.0.1:8000")
    assert "sk-abc" not in str(error.value)


def test_retry_after_is_capped_by_the_longest_backoff():
    slept = []
    client = HttpClient("http://127.0.0.1:9", sleep=slept.append)
    client._wait(0.5, "86400")
    client._wait(0.5, "Wed, 21 Oct 2099 07:28:00 GMT")
    client._wait(0.5, "soon")
    assert slept == [30.0, 30.0, 0.5]


def test_the_threat_model_lists_every_misbehaviour():
    text = (Path(__file__).resolve().parents[1] / "docs" / "endpoint.md").read_text()
    assert "## Threat model" in text
    for m in MISBEHAVIOURS.values():
        assert f"| {m.klass} | `{m.name}` | {m.what} |" in text, m.name


# ----------------------------------------------------------------------------------- Ctrl-C
def _signal_state(pid: int) -> str:
    """The child's signal masks when SIGINT is sent (blocked, ignored, caught), for a failure message."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return "no /proc status"
    return "; ".join(line for line in lines if line.startswith(("SigBlk", "SigIgn", "SigCgt", "State")))


def _interactive_sigint() -> None:
    """In the child before exec: SIGINT delivered and at its default, as under an interactive shell
    (a disposition inherited from the test process -- ignored, or blocked -- would otherwise carry
    into the audit, which then never sees the Ctrl-C this test sends)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupt(command: list[str], ready) -> tuple[subprocess.CompletedProcess, float]:
    """Start ``command``, send SIGINT once ``ready()`` holds; its outcome and how long it took to exit.

    The outcome's stderr ends with the child's signal state at the moment SIGINT was sent (SIGINT
    is bit 2 of the masks), so that a run in which it did not end says whether SIGINT was blocked
    or ignored there."""
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_interactive_sigint
    )
    started = time.monotonic()
    while not ready() and process.poll() is None and time.monotonic() - started < 60:
        time.sleep(0.02)
    assert process.poll() is None, process.communicate()
    state = _signal_state(process.pid)
    sent = time.monotonic()
    process.send_signal(signal.SIGINT)
    try:
        out, err = process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        raise AssertionError(f"no exit 30 s after SIGINT; at SIGINT: {state}; stderr: {err[-1500:]}") from None
    return subprocess.CompletedProcess(
        command,
        process.returncode,
        out,
        err + ("" if err.endswith("\n") or not err else "\n") + f"[at SIGINT: {state}]\n",
    ), time.monotonic() - sent


def _stored(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


@pytest.mark.parametrize("where", ["between requests", "inside a slow reply"])
def test_ctrl_c_is_one_line_exit_130_and_the_same_command_resumes(hostile, clean, tmp_path, where):
    """SIGINT ends the audit promptly, requests in flight abandoned (even a reply still dripping in): well
    before the 30 s read timeout that waiting for the dripping reply would take.  The bound, 10 s, is that
    separation with room for a loaded machine (2.5 s measured with two other CPU-heavy
    jobs on 2 cores); it is not a speed claim."""
    out = tmp_path / "out"
    url = hostile.url if where == "between requests" else hostile.hostile("drip", 6, run=f"int-{tmp_path.name}")
    command = [sys.executable, "-m", "specverify", "audit", "--endpoint", url, "--model", "tiny-reference", *FAST,
               "--request-timeout", "60", "--read-timeout", "30", "--out", str(out)]  # fmt: skip
    store = out / STORE_NAME
    if where == "between requests":
        interrupted, seconds = _interrupt(command, lambda: _stored(store) >= 12)
    else:  # the header and four replies stored (the two probes are not): the next reply is dripping in
        interrupted, seconds = _interrupt(command, lambda: _stored(store) >= 5 and time.sleep(1.0) is None)
    assert interrupted.returncode == 130, interrupted.stderr[-2000:]
    assert seconds < 10.0, seconds
    said = [line for line in interrupted.stderr.splitlines() if not line.startswith(("[", "will send"))]
    stored = len(read_store(store).records)
    assert said == [f"specverify: interrupted: {stored:,} of at most {said[0].split('at most ')[1].split()[0]} "
                    f"requests stored in {out}; the same command resumes"], said  # fmt: skip
    if where == "inside a slow reply":
        hostile.heal(f"int-{tmp_path.name}")
    resumed = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    plan = next(line for line in resumed.stderr.splitlines() if line.startswith("will send"))
    assert f"{stored:,} replies already stored (resumed)" in plan
    assert _statistics(json.loads((out / "report.json").read_text())) == clean
