"""The served-vLLM report generator (``tools/reports/vllm_served.py``) without vLLM, and its server with it.

Without vLLM: the serve command line of each configuration (its speculative config is the
in-process engine's), the audit arguments as the CLI parses them, waiting for a server (ready,
exited, timeout), the ``/metrics`` counters, where a sample store goes, the README from fake
reports, and one configuration run end to end against the local test server
(``specverify.endpoint.localserver``) in place of vLLM.  With vLLM (skipped without it): vLLM's own
argument parser reads every serve command line as meant; a real server audit is ``slow``.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tools.reports import vllm_served as vs

ROOT = Path(__file__).resolve().parents[1]
MODELS = vs.Models(Path("m/target"), Path("m/draft"), Path("m/eagle"), Path("m/tokenizer"))
BY_NAME = {c.name: c for c in vs.CONFIGS}


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ----------------------------------------------------------------------------- serve command lines

needs_engine_module = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None, reason="the engine module needs transformers"
)


@needs_engine_module
def test_every_configuration_has_a_serve_command_line():
    for config in vs.CONFIGS:
        argv = vs.serve_argv(config, MODELS, port=8011)
        assert argv[:3] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
        assert _flag(argv, "--model") == "m/target" and _flag(argv, "--served-model-name") == vs.MODEL
        assert (_flag(argv, "--host"), _flag(argv, "--port")) == ("127.0.0.1", "8011")
        assert _flag(argv, "--max-logprobs") == "-1" and _flag(argv, "--dtype") == "float32"
        assert "--enforce-eager" in argv and ("--skip-tokenizer-init" in argv) != config.tokenizer
        assert shlex.split(vs.serve_line(argv)) == ["VLLM_CPU_KVCACHE_SPACE=1", *argv]
    assert "--speculative-config" not in vs.serve_argv(BY_NAME["control_no_spec_t1.0"], MODELS)


@needs_engine_module
@pytest.mark.parametrize(
    "name, expected",
    [
        ("ngram_k3_t1.0", {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}),
        ("draft_probabilistic_k3_t1.0", {"method": "draft_model", "model": "m/draft", "num_speculative_tokens": 3,
                                         "draft_sample_method": "probabilistic"}),
        ("eagle_k3_t1.0", {"method": "eagle", "model": "m/eagle", "num_speculative_tokens": 3,
                           "draft_sample_method": "greedy"}),
    ],
)  # fmt: skip
def test_speculative_configs_are_the_in_process_ones(name, expected):
    from specverify.adapters.vllm.engine import VllmDecoder

    argv = vs.serve_argv(BY_NAME[name], MODELS)
    assert json.loads(_flag(argv, "--speculative-config")) == expected
    config = BY_NAME[name]
    decoder = VllmDecoder("m/target", method=config.method, k=3, draft_dir="m/draft", eagle_dir="m/eagle",
                          draft_sample_method=config.draft_sample_method)  # fmt: skip
    assert decoder._speculative_config() == expected


def test_configurations_name_their_in_process_reports():
    plain = [c for c in vs.CONFIGS if not c.options]
    assert [c.method for c in plain] == [None, "ngram", "draft_model", "eagle", "ngram", "draft_model", "eagle"]
    assert [c.skip_determinism for c in plain] == [False] * 4 + [True] * 3
    for config in plain:
        assert config.inprocess, config.name
        for name in config.inprocess:
            assert (ROOT / "reports" / "vllm" / name / "report.json").exists(), name


def test_the_option_matrix_has_each_option_family_without_and_with_each_method(tmp_path):
    """Four option families x (no speculation, ngram, draft model, EAGLE); the options reach the audit command."""
    matrix = [c for c in vs.CONFIGS if c.options]
    families = {c.options for c in matrix}
    assert families == {vs.PENALTIES, vs.MIN_P_BIAS, vs.LOGPROBS, vs.SCHEMA}
    for family in families:
        assert sorted(str(c.method) for c in matrix if c.options == family) == ["None", "draft_model", "eagle", "ngram"]
    assert all(c.skip_determinism == (c.method is not None) for c in matrix)
    argv = vs.audit_argv(port=1, seed=0, tier="smoke", num_samples=None, out=tmp_path, options=vs.MIN_P_BIAS)
    assert argv[argv.index("--min-p") + 1] == "0.02" and argv.count("--logit-bias") == 2


def test_logprob_configurations_are_served_with_the_word_level_tokenizer():
    """vLLM renders logprobs only with a tokenizer: those rows swap --skip-tokenizer-init for one, keyed by id."""
    for config in vs.CONFIGS:
        argv = vs.serve_argv(config, MODELS)
        if config.tokenizer:
            assert config.options == vs.LOGPROBS and "--skip-tokenizer-init" not in argv
            assert argv[argv.index("--tokenizer") + 1] == "m/tokenizer" and "--return-tokens-as-token-ids" in argv
        else:
            assert "--skip-tokenizer-init" in argv and "--tokenizer" not in argv
    assert sum(c.tokenizer for c in vs.CONFIGS) == 4


def test_the_word_level_tokenizer_names_each_id(tmp_path):
    pytest.importorskip("tokenizers")
    from transformers import AutoTokenizer

    path = vs.write_tokenizer(tmp_path / "tokenizer", vocab_size=32)
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert len(tokenizer) == 32 and tokenizer.convert_ids_to_tokens([0, 7, 31]) == ["<t0>", "<t7>", "<t31>"]
    assert tokenizer("<t3> <t30>")["input_ids"] == [3, 30]


def test_audit_arguments_parse_to_the_canonical_endpoint_command(tmp_path):
    from specverify.cli.commands import parse_command
    from specverify.cli.endpoint import endpoint_command

    assert "--skip-determinism" in vs.audit_argv(port=1, seed=0, tier="smoke", num_samples=None, out=tmp_path,
                                                 skip_determinism=True)  # fmt: skip
    argv = vs.audit_argv(port=8011, seed=3, tier="smoke", num_samples=500, out=tmp_path / "x")
    args = parse_command("specverify audit " + shlex.join(argv))
    assert (args.endpoint, args.model, args.samples_per_request, args.num_samples) == (
        "http://127.0.0.1:8011", vs.MODEL, vs.SAMPLES_PER_REQUEST, 500)  # fmt: skip
    assert args.out == str(tmp_path / "x")
    command = endpoint_command(args)
    assert command == (
        f"specverify audit --endpoint http://127.0.0.1:8011 --model {vs.MODEL} --temperature 1 --num-samples 500 "
        f"--samples-per-request {vs.SAMPLES_PER_REQUEST} --tier smoke --seed 3 --alpha 0.001"
    )
    assert "--num-samples" not in vs.audit_argv(port=1, seed=0, tier="smoke", num_samples=None, out=tmp_path)


# ----------------------------------------------------------------------------- waiting for the server


class _Models(BaseHTTPRequestHandler):
    served = [vs.MODEL]

    def do_GET(self):
        body = json.dumps({"object": "list", "data": [{"id": m} for m in self.served]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def models_server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Models)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_wait_ready_returns_once_the_model_is_listed(models_server):
    assert vs.wait_ready(models_server, proc=None, timeout=5.0) >= 0.0


def test_wait_ready_times_out_with_what_it_last_saw(models_server, tmp_path):
    log = tmp_path / "server.log"
    log.write_text("line one\nstill loading\n")
    with pytest.raises(
        vs.ServerError, match=r"(?s)within 0 s \(it serves \['tiny-llama'\], not 'other'\).*still loading"
    ):
        vs.wait_ready(models_server, proc=None, timeout=0.2, model="other", log=log, poll=0.05)


def test_wait_ready_stops_when_the_server_exits(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("ValueError: Couldn't instantiate the backend tokenizer\n")
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
    proc.wait()
    with pytest.raises(vs.ServerError, match=r"(?s)exited with code 3 .*backend tokenizer"):
        vs.wait_ready(f"http://127.0.0.1:{_free_port()}", proc=proc, timeout=30.0, log=log)


def test_a_taken_port_is_refused(models_server, tmp_path):
    port = int(models_server.rsplit(":", 1)[1])
    with pytest.raises(vs.ServerError, match="already answers"):
        with vs.Server(["python", "-c", "pass"], log=tmp_path / "log", port=port, ready_timeout=1.0):
            pass


# ----------------------------------------------------------------------------- metrics, samples


METRICS = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="tiny-llama"} 340.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="tiny-llama"} 1.79e+09
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="tiny-llama"} 1020.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="tiny-llama"} 12.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny-llama",position="1"} 1.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny-llama",position="0"} 11.0
vllm:num_requests_running{engine="0",model_name="tiny-llama"} 0.0
"""


def test_spec_decode_counters_are_read_from_the_metrics_text():
    counters = vs.spec_decode_counters(METRICS)
    assert counters == {"drafts": 340, "draft_tokens": 1020, "accepted_tokens": 12,
                        "accepted_per_position": {"0": 11, "1": 1}}  # fmt: skip
    assert vs._acceptance(counters) == "12 / 1,020 (1.2 %); position 1: 3.2 %"
    assert vs.spec_decode_counters("vllm:num_requests_running 0.0\n") is None
    assert vs._acceptance(None) == "-"
    one = {"distinct_prefix_laws": 1, "teacher_forcing_requests": 1, "laws_per_request": 1.0}
    assert vs._memo({"memo": one}) == "1.00 (1 law / 1 request)" and vs._memo({"memo": None}) == "-"


def test_a_large_sample_store_stays_in_scratch(tmp_path):
    store, dest = tmp_path / "scratch" / "samples.jsonl", tmp_path / "out"
    store.parent.mkdir()
    store.write_text("x" * 100)
    assert vs.place_samples(store, dest, limit=100) == {"bytes": 100, "path": "samples.jsonl", "committed": True}
    assert (dest / "samples.jsonl").read_text() == "x" * 100
    assert vs.place_samples(store, dest, limit=99) == {"bytes": 100, "path": str(store), "committed": False}
    assert not (dest / "samples.jsonl").exists()  # the earlier copy is gone
    assert vs.place_samples(tmp_path / "none.jsonl", dest)["bytes"] == 0


# ----------------------------------------------------------------------------- README


def _result(grade, adj, tv, p=0.5):
    return dict(grade=grade, family="gof", name="chisq", scenario="prompt0", position="abs=1", statistic=3.0,
                pvalue=p, adjusted_pvalue=adj, n=4000, mde_tv=tv)  # fmt: skip


def _report(verdict, *, errors=(), results=(), memo=None):
    endpoint = {
        "requests_sent": {"decoder": 164, "target": 7662 if memo else 1},
        "requests_from_store": 0,
        "memo": memo,
    }
    return dict(verdict=verdict, passed=verdict in ("pass", "suspicious"), errors=list(errors), results=list(results),
                scenarios=[{}, {}],
                command=f"specverify audit --endpoint http://127.0.0.1:8000 --model {vs.MODEL} --tier smoke",
                timings={"total": 80.0}, extra={"endpoint": endpoint})  # fmt: skip


def _write(out: Path, name: str, report: dict | None, **run) -> None:
    (out / name).mkdir(parents=True, exist_ok=True)
    if report is not None:
        (out / name / "report.json").write_text(json.dumps(report))
    record = dict(name=name, serve_command=f"VLLM_CPU_KVCACHE_SPACE=1 python -m x --model m/target # {name}",
                  models_dir="build/vllm_served/models", versions={"vllm": "0.32.0", "torch": "2.13.0+cpu", "python": "3.11.7"},
                  seed=0, tier="smoke", num_samples=None, samples_per_request=50, error=None, startup_seconds=25.0,
                  audit_seconds=80.0, wall_seconds=110.0, spec_decode=None,
                  samples={"bytes": 19_000_000, "path": f"build/vllm_served/{name}/samples.jsonl", "committed": False})  # fmt: skip
    record.update(run)
    (out / name / "run.json").write_text(json.dumps(record))


def test_readme_renders_one_row_per_configuration_and_the_comparison(tmp_path):
    out, inprocess = tmp_path / "vllm" / "served", tmp_path / "vllm"
    memo = {"distinct_prefix_laws": 27840, "teacher_forcing_requests": 7662, "laws_asked": 64001,
            "laws_per_request": 3.634}  # fmt: skip
    _write(out, "control_no_spec_t1.0", _report("suspicious", results=[_result("suspicious", 0.06, 0.065)], memo=memo))
    error = ("prompt0: decoder.generate(prompt=[28, 31, 8, 31], num_samples=16, max_new_tokens=8, seed=1) is not "
             "deterministic: two calls with the same seed differ in 13 of 16 rows (row 1: [1] vs [2])")  # fmt: skip
    _write(out, "ngram_k3_t1.0", _report("error", errors=[error, error]),
           spec_decode={"drafts": 100, "draft_tokens": 300, "accepted_tokens": 30, "accepted_per_position": {"0": 20}},
           samples={"bytes": 500_000, "path": "samples.jsonl", "committed": True})  # fmt: skip
    _write(
        out,
        "draft_probabilistic_k3_t1.0",
        _report("fail", results=[_result("fail", 1e-9, 0.07, p=1e-10), _result("pass", 1.0, 0.06)], memo=memo),
    )
    _write(out, "eagle_k3_t1.0", None, error="ServerError: the server exited with code 1 before answering")
    for name, verdict in (("e2e_control_no_spec_t1.0", "pass"), ("e2e_ngram_k3_t1.0", "error"),
                          ("e2e_ngram_k3_t1.0_memoize", "fail"), ("e2e_draft_probabilistic_k3_t1.0", "pass")):  # fmt: skip
        (inprocess / name).mkdir(parents=True)
        (inprocess / name / "report.json").write_text(json.dumps({"verdict": verdict, "passed": verdict == "pass"}))

    text = vs.render_readme(out, vs.CONFIGS[:4], inprocess=inprocess, seed=0, tier="smoke")
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    results = rows[1:5]
    assert results[0].startswith("| [`control_no_spec_t1.0`](control_no_spec_t1.0/report.md) | control: no speculation")
    assert (
        "**SUSPICIOUS** | detectable TV median 0.065 (best 0.065, worst 0.065); strongest: [SUSPICIOUS] " in results[0]
    )
    assert (
        "164 sampling + 7,662 teacher forcing | 3.63 (27,840 laws / 7,662 requests) | - | 25 s + 80 s |" in results[0]
    )
    assert "**ERROR** | 2 of 2 prompts not tested: prompt0: decoder.generate(" in results[1]
    assert "differ in 13 of 16 rows |" in results[1]  # cut before the rows themselves
    assert "| 30 / 300 (10.0 %); position 1: 20.0 % |" in results[1]
    assert "**FAIL** |" in results[2] and "strongest: [FAIL] gof/chisq prompt0/abs=1" in results[2]
    assert results[3].startswith("| `eagle_k3_t1.0` |") and "**NOT RUN** | ServerError: the server exited" in results[3]
    comparison = rows[-4:]
    assert comparison[0] == ("| `control_no_spec_t1.0` | **SUSPICIOUS** | [`e2e_control_no_spec_t1.0`]"
                             "(../e2e_control_no_spec_t1.0/report.md): **PASS** | no; both pass the gate | - |")  # fmt: skip
    assert "| **ERROR** | [`e2e_ngram_k3_t1.0`](../e2e_ngram_k3_t1.0/report.md): **ERROR** | yes |" in comparison[1]
    assert "[`e2e_ngram_k3_t1.0_memoize`](../e2e_ngram_k3_t1.0_memoize/report.md): **FAIL**" in comparison[1]
    assert "e2e_ngram_k3_t1.0_patch_expand/report.md): missing" in comparison[1]
    assert "| **FAIL** |" in comparison[2] and "| **no** |" in comparison[2]
    assert comparison[3].startswith("| `eagle_k3_t1.0` | not run |") and "| - |" in comparison[3]
    assert "`python -m tools.reports.vllm_served --out " in text and "--seed 0 --tier smoke`" in text
    assert "2 prompts x 4,000 samples x 8 new tokens" in text and "Total wall time of the configurations" in text
    assert "[`samples.jsonl`](ngram_k3_t1.0/samples.jsonl), 0.5 MB" in text
    assert "`build/vllm_served/control_no_spec_t1.0/samples.jsonl` (scratch, not committed), 19.0 MB" in text
    assert "VLLM_CPU_KVCACHE_SPACE=1 python -m x --model m/target # eagle_k3_t1.0" in text
    assert "{" not in re.sub(r"`[^`]*`", "", text.split("## Results")[1])  # every template field filled


def test_readme_only_writes_the_readme(tmp_path, capsys):
    out = tmp_path / "served"
    _write(out, "control_no_spec_t1.0", _report("pass", results=[_result("pass", 1.0, 0.065)]))
    assert vs.main(["--out", str(out), "--readme-only", "--inprocess", str(tmp_path), "--num-samples", "300"]) == 0
    text = (out / "README.md").read_text()
    assert "--num-samples 300`" in text and "control_no_spec_t1.0" in text
    with pytest.raises(SystemExit):
        vs.main(["--out", str(out), "--only", "nope"])


# ----------------------------------------------------------------------------- one configuration end to end


@needs_engine_module
def test_one_configuration_end_to_end_against_the_local_test_server(tmp_path, monkeypatch):
    """The whole path -- serve, wait, audit, report, run.json, stop -- with the local test server in place of vLLM."""
    port = _free_port()
    local = ["python", "-m", "specverify.endpoint.localserver", "--port", str(port), "--max-logprobs", "-1",
             "--model-name", vs.MODEL, "--no-speculation"]  # fmt: skip
    monkeypatch.setattr(vs, "serve_argv", lambda config, models, port: local)
    out, scratch = tmp_path / "out", tmp_path / "scratch"
    record = vs.run_config(vs.CONFIGS[0], MODELS, out=out, scratch=scratch, seed=0, tier="smoke", num_samples=200,
                           port=port, ready_timeout=60.0)  # fmt: skip
    assert record["error"] is None, record["error"]
    report = json.loads((out / vs.CONFIGS[0].name / "report.json").read_text())
    assert report["verdict"] in ("pass", "suspicious")
    assert report["command"].startswith(f"specverify audit --endpoint http://127.0.0.1:{port} --model {vs.MODEL}")
    assert record["spec_decode"] is None  # the local server has no /metrics
    assert record["samples"]["committed"] and (out / vs.CONFIGS[0].name / "samples.jsonl").exists()
    assert json.loads((out / vs.CONFIGS[0].name / "run.json").read_text())["audit_command"] == report["command"]
    assert not vs.port_answers(port)  # the server was stopped


# ----------------------------------------------------------------------------- with vLLM


@needs_engine_module
def test_vllms_own_parser_reads_every_serve_command_line():
    pytest.importorskip("vllm")
    code = r"""
import json, shlex, sys
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
for line in json.loads(sys.argv[1]):
    argv = shlex.split(line)[4:]  # drop the environment and python -m module
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
    spec = argv[argv.index("--speculative-config") + 1] if "--speculative-config" in argv else None
    assert args.max_logprobs == -1 and args.skip_tokenizer_init and args.enforce_eager, line
    assert args.dtype == "float32" and args.max_model_len == 128 and args.port == 8000, line
    assert args.speculative_config == (None if spec is None else json.loads(spec)), (args.speculative_config, line)
print("ok")
"""
    lines = [vs.serve_line(vs.serve_argv(c, MODELS)) for c in vs.CONFIGS]
    done = subprocess.run([sys.executable, "-c", code, json.dumps(lines)], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


@pytest.mark.slow
def test_a_served_control_audit(tmp_path):
    """vLLM without speculation, served and audited at a small size (about a minute)."""
    pytest.importorskip("vllm")
    models = vs.write_models(tmp_path / "models")
    port = _free_port()
    record = vs.run_config(vs.CONFIGS[0], models, out=tmp_path / "out", scratch=tmp_path / "scratch", seed=0,
                           tier="smoke", num_samples=200, port=port, ready_timeout=300.0)  # fmt: skip
    assert record["error"] is None, record["error"]
    report = json.loads((tmp_path / "out" / vs.CONFIGS[0].name / "report.json").read_text())
    assert report["verdict"] in ("pass", "suspicious"), report["errors"]
    assert report["extra"]["endpoint"]["memo"]["laws_per_request"] > 1
