"""Fuzzing what a server, a damaged file or a hostile report can put in front of the client.

Hypothesis feeds arbitrary JSON values and bytes to the reply parser (``decode_json``,
``continuations``, ``prompt_logprob_rows``), to the HTTP client through a raw socket that answers
whatever bytes it is given, to the store reader (arbitrary bytes, and a real store damaged one way
or another), and to the report loader.  The only exceptions allowed are ``EndpointError`` (and
``InvalidArgument`` for a report); a store the reader accepts holds a prefix of the records that
were written, never an altered one; a report the loader accepts renders.
"""

from __future__ import annotations

import json
import math
import socket
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specverify.core.errors import InvalidArgument
from specverify.endpoint.api import continuations, prompt_logprob_rows
from specverify.endpoint.http import EndpointError, HttpClient, Limits, decode_json
from specverify.endpoint.store import SampleStore, parse_store

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([0, 1, 63, 64, -1, 2**63, 10**30])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.sampled_from(["token_id:3", "token_id:x", "token_id:99999999999999999999", "NaN", "-inf"])
)
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(
        st.sampled_from(["choices", "index", "token_ids", "logprobs", "tokens", "prompt_logprobs", "logprob",
                         "0", "1", "2", "63", "64", "-1", "01", " 1", "x"]) | st.text(max_size=4),
        children,
        max_size=5,
    ),
    max_leaves=40,
)  # fmt: skip


def _near_valid_sampling(draw_ids):
    return {"choices": [{"index": 0, "token_ids": draw_ids}]}


@FUZZ
@given(reply=json_values, n=st.integers(1, 3), L=st.integers(1, 3), V=st.none() | st.integers(1, 70))
def test_the_sampling_reply_parser_returns_valid_ids_or_one_error(reply, n, L, V):
    for candidate in (reply, {"choices": reply}, {"choices": [reply]}, _near_valid_sampling(reply)):
        try:
            rows = continuations(candidate, n=n, max_tokens=L, vocab_size=V)
        except EndpointError:
            continue
        assert len(rows) == n and all(len(r) == L for r in rows)
        upper = V if V is not None else 2**20
        assert all(type(t) is int and 0 <= t < upper for r in rows for t in r)


@FUZZ
@given(row=json_values, extra=st.dictionaries(st.text(max_size=3), json_values, max_size=3), V=st.none() | st.just(4))
def test_the_logprob_reply_parser_returns_laws_or_one_error(row, extra, V):
    valid = {str(t): {"logprob": math.log(0.25)} for t in range(4)}
    for entry in (row, {**valid, **extra}, dict(valid, **{"0": row})):
        reply = {"choices": [{"prompt_logprobs": [None, entry]}]}
        try:
            rows = prompt_logprob_rows(reply, [0, 1], V)
        except EndpointError:
            continue
        assert rows.shape[0] == 1 and not math.isnan(rows.sum())
        assert abs(math.fsum(math.exp(x) for x in rows[0]) - 1) <= 1e-3


@FUZZ
@given(raw=st.binary(max_size=200) | json_values.map(lambda v: json.dumps(v).encode()))
def test_decoding_a_reply_gives_json_or_one_error(raw):
    try:
        value = decode_json(raw)
    except EndpointError as error:
        assert "\n" not in str(error)
        return
    json.dumps(value, allow_nan=False)  # what was accepted is plain JSON: no NaN, no infinity


class _RawServer:
    """Answers every connection with the bytes it is set to, then closes (a bounded thread per connection)."""

    def __init__(self):
        self.payload = b""
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(connection, self.payload), daemon=True).start()

    @staticmethod
    def _answer(connection, payload):
        with connection:
            connection.settimeout(2)
            try:
                received = b""
                while b"\r\n\r\n" not in received and len(received) < 1 << 16:
                    chunk = connection.recv(1 << 14)
                    if not chunk:
                        return
                    received += chunk
                connection.sendall(payload)
            except OSError:
                return


@pytest.fixture(scope="module")
def raw_server():
    server = _RawServer()
    yield server
    server.listener.close()


heads = st.sampled_from([b"", b"HTTP/1.1 200 OK\r\n", b"HTTP/1.1 500 Oops\r\n", b"HTTP/1.0 302 Found\r\n",
                         b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", b"HTTP/1.1 100 Continue\r\n\r\n",
                         b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"])  # fmt: skip


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(head=heads, rest=st.binary(max_size=120))
def test_the_client_turns_any_bytes_into_a_reply_or_one_error(raw_server, head, rest):
    raw_server.payload = head + rest
    client = HttpClient(raw_server.url, limits=Limits(read_timeout=0.3, request_timeout=1.0, retries=0))
    try:
        value = client.post("completions", {"x": 1}, max_bytes=1 << 10)
    except EndpointError as error:
        assert "\n" not in str(error) and "\r" not in str(error)
        return
    json.dumps(value, allow_nan=False)


# ----------------------------------------------------------------------------------- the store
@pytest.fixture(scope="module")
def written_store(tmp_path_factory):
    directory = tmp_path_factory.mktemp("store")
    with SampleStore(directory, {"model": "m", "seed": 0}) as store:
        for i in range(6):
            store.add(f"key{i}", "decoder" if i % 2 else "target", {"prompt": [i]}, [[i, i + 1], [0.5 * i]])
    raw = (directory / "samples.jsonl").read_bytes()
    return raw, parse_store(raw).records


@FUZZ
@given(raw=st.binary(max_size=300))
def test_the_store_reader_reads_any_bytes_or_refuses_in_one_line(raw):
    try:
        parse_store(raw)
    except EndpointError as error:
        assert "\n" not in str(error)


damage = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10**6), st.integers(1, 255)),
    st.tuples(st.just("swap"), st.integers(0, 10**6), st.integers(0, 10**6)),
    st.tuples(st.just("drop"), st.integers(0, 10**6), st.just(0)),
    st.tuples(st.just("repeat"), st.integers(0, 10**6), st.just(0)),
    st.tuples(st.just("cut"), st.integers(0, 10**6), st.just(0)),
)


def _damaged(raw: bytes, how) -> bytes:
    kind, i, j = how
    lines = raw.split(b"\n")[:-1]
    if not raw or not lines:
        return raw
    if kind == "flip":
        i %= len(raw)
        return raw[:i] + bytes([raw[i] ^ j]) + raw[i + 1 :]
    if kind == "cut":
        return raw[: i % len(raw)]
    a, b = i % len(lines), j % len(lines)
    if kind == "swap":
        lines[a], lines[b] = lines[b], lines[a]
    elif kind == "drop":
        del lines[a]
    else:
        lines.insert(a, lines[a])
    return b"\n".join(lines) + b"\n"


@FUZZ
@given(how=st.lists(damage, min_size=1, max_size=3))
def test_a_damaged_store_is_refused_or_reads_as_a_prefix_of_what_was_written(written_store, how):
    raw, records = written_store
    damaged = raw
    for step in how:
        damaged = _damaged(damaged, step)
    try:
        read = parse_store(damaged).records
    except EndpointError:
        return
    assert read == records[: len(read)], "the store accepted altered records"


# ----------------------------------------------------------------------------------- the report loader
@pytest.fixture(scope="module")
def report_dict():
    from specverify.core.results import Report, TestResult

    result = TestResult(0.5, 0.5, "gof", "gof", "chi2", 10, scenario="s", grade="pass", adjusted_pvalue=0.5)
    report = Report("decoder", "impl", "smoke", 0, 1e-3, "pass", results=(result,), scenarios=({"name": "s"},))
    return report.to_dict()


@FUZZ
@given(raw=st.binary(max_size=200), value=json_values, field=st.sampled_from(
    ["kind", "implementation", "tier", "seed", "alpha", "verdict", "results", "errors", "scenarios", "timings",
     "environment", "extra", "command", "gate_conformance", "schema"]))  # fmt: skip
def test_the_report_loader_loads_a_report_or_refuses_in_one_error(tmp_path_factory, report_dict, raw, value, field):
    from specverify.report import load_report, render_html, render_markdown

    directory = tmp_path_factory.mktemp("report", numbered=True)
    for text in (raw, json.dumps(value).encode(), json.dumps({**report_dict, field: value}).encode()):
        (directory / "report.json").write_bytes(text)
        try:
            report = load_report(directory)
        except InvalidArgument as error:
            assert "\n" not in str(error)
            continue
        report.summary()
        render_markdown(report)
        render_html(report, plots=False)


#: The names the report's renderers look up in ``extra``, a scenario or a test's ``details``.
RENDERED_KEYS = ("acceptance accepted bin_tokens ci_high ci_level ci_low client_overhead_fraction culprit determinism "
                 "draft_cost drafted endpoint error exact expected expected_rate failed_tests k latency length_counts "
                 "length_probs mde_shared_fraction mean_accepted mean_accepted_ci memo message mode model_note "
                 "model_params n name note observed observed_rate position positions protocol reference_url "
                 "requests_sent rounds sampling speedup speedups target_pass_seconds teacher_forcing_requests tokens "
                 "tokens_per_bin tolerance top_k top_p total url vocab_size diagnosis efficiency batch_invariance "
                 "retried waiting_seconds client_overhead_seconds laws_per_request distinct_prefix_laws laws_asked "
                 "temperature requests_from_store requests_in_store_at_start tokens_received").split()  # fmt: skip
section_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.sampled_from(RENDERED_KEYS), children, max_size=6)
    ),
    max_leaves=30,
)


@FUZZ
@given(extra=st.dictionaries(st.sampled_from(["endpoint", "acceptance", "diagnosis", "efficiency", "mode"]),
                             section_values, max_size=3),
       details=st.dictionaries(st.sampled_from(RENDERED_KEYS), section_values, max_size=5),
       scenario=st.dictionaries(st.sampled_from(RENDERED_KEYS), section_values, max_size=5))  # fmt: skip
def test_a_loaded_report_renders_whatever_its_sections_hold(report_dict, extra, details, scenario):
    from specverify.core.results import Report
    from specverify.report import render_html, render_markdown, terminal_summary

    data = json.loads(json.dumps(report_dict))
    data["extra"] = extra
    data["results"][0]["details"] = details
    data["results"][0]["grade"] = "fail"
    data["scenarios"] = [{**scenario, "name": "s"}]
    try:
        report = Report.from_dict(json.loads(json.dumps(data, default=str)))
    except InvalidArgument:
        return
    report.summary()
    terminal_summary(report)
    render_markdown(report)
    render_html(report, plots=False)
