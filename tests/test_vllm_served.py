"""The served-vLLM report generator (``tools/reports/vllm_served.py``) without vLLM, and its server with it.

Without vLLM: the serve command line of each configuration (its speculative config is the
in-process engine's), the audit arguments as the CLI parses them, waiting for a server (ready,
exited, timeout), the ``/metrics`` counters, where a sample store goes, the README from fake
reports, and one configuration run end to end against the local test server
(``specverify.endpoint.localserver``) in place of vLLM.  With vLLM (skipped without it): vLLM's own
argument parser reads every serve command line as meant; a real server audit is ``slow``.
"""

from __future__ import annotations

import dataclasses
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
import torch

from tools.reports import vllm_served as vs
from tools.reports import vllm_served_configs as vc
from tools.reports import vllm_served_readme as vr

ROOT = Path(__file__).resolve().parents[1]
MODELS = vs.Models(
    Path("m/target"),
    Path("m/draft"),
    Path("m/eagle"),
    Path("m/tokenizer"),
    Path("m/characters"),
    Path("m/eagle3"),
    Path("m/mimo"),
)
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
        assert _flag(argv, "--model") == ("m/mimo" if config.target == "mimo" else "m/target")
        assert _flag(argv, "--served-model-name") == vs.MODEL
        assert (_flag(argv, "--host"), _flag(argv, "--port")) == ("127.0.0.1", "8011")
        assert _flag(argv, "--max-logprobs") == "-1" and _flag(argv, "--dtype") == "float32"
        assert "--enforce-eager" in argv and ("--skip-tokenizer-init" in argv) != bool(config.tokenizer)
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
        ("eagle3_k3_t1.0", {"method": "eagle3", "model": "m/eagle3", "num_speculative_tokens": 3,
                            "draft_sample_method": "greedy"}),
        ("mtp_k3_t1.0", {"method": "mtp", "num_speculative_tokens": 3, "draft_sample_method": "greedy"}),
    ],
)  # fmt: skip
def test_speculative_configs_are_the_in_process_ones(name, expected):
    from specverify.adapters.vllm.engine import VllmDecoder

    argv = vs.serve_argv(BY_NAME[name], MODELS)
    assert json.loads(_flag(argv, "--speculative-config")) == expected
    config = BY_NAME[name]
    decoder = VllmDecoder("m/target", method=config.method, k=3, draft_dir="m/draft", eagle_dir="m/eagle3" if config.method == "eagle3" else "m/eagle",
                          draft_sample_method=config.draft_sample_method)  # fmt: skip
    assert decoder._speculative_config() == expected


def test_configurations_name_their_in_process_reports():
    plain = [c for c in vs.CONFIGS if not c.options]
    methods = [None, "ngram", "draft_model", "eagle", "ngram", "draft_model", "eagle", "eagle3", "eagle3", None, "mtp",
               "mtp"]  # fmt: skip
    assert [c.method for c in plain] == methods
    assert [c.skip_determinism for c in plain] == [False] * 4 + [True] * 3 + [False, True] + [False, False, True]
    assert [c.name for c in plain if c.target == "mimo"] == [
        "control_no_spec_mimo_t1.0", "mtp_k3_t1.0", "mtp_k3_t1.0_skip_determinism"]  # fmt: skip
    for config in plain:
        if config.method in ("eagle3", "mtp") or config.target == "mimo":  # no in-process report of these
            assert not config.inprocess
            continue
        assert config.inprocess, config.name
        for name in config.inprocess:
            assert (ROOT / "reports" / "vllm" / name / "report.json").exists(), name


def test_the_option_matrix_has_each_option_family_without_and_with_each_method(tmp_path):
    """Six option families x (no speculation, ngram, draft model, EAGLE); the options reach the audit command."""
    matrix = [c for c in vs.CONFIGS if c.options]
    families = {c.options for c in matrix}
    assert families == {vc.SAMPLING, vc.PENALTIES, vc.MIN_P_BIAS, vc.REPETITION, vc.LOGPROBS, vc.SCHEMA}
    for family in families:
        methods = sorted(str(c.method) for c in matrix if c.options == family)
        assert methods == ["None", "None", "draft_model", "eagle", "eagle3", "mtp", "ngram"]  # Llama, then MiMo
        assert [c.target for c in matrix if c.options == family and c.method in (None, "mtp")] == [
            "llama", "mimo", "mimo"]  # fmt: skip
    assert all(c.skip_determinism == (c.method is not None) for c in matrix)
    assert len({c.name for c in vs.CONFIGS}) == len(vs.CONFIGS) == 12 + 6 * 5 + 6 * 2
    argv = vs.audit_argv(port=1, seed=0, tier="smoke", num_samples=None, out=tmp_path, options=vc.MIN_P_BIAS)
    assert argv[argv.index("--min-p") + 1] == "0.02" and argv.count("--logit-bias") == 2
    with pytest.raises(ValueError, match="tokenizer"):
        vc.Served("x", "x", None, tokenizer="bpe")
    with pytest.raises(ValueError, match="target"):
        vc.Served("x", "x", None, target="gpt")
    with pytest.raises(ValueError, match="drafts for the mimo target"):
        vc.Served("x", "x", "mtp")
    with pytest.raises(ValueError, match="drafts for the llama target"):
        vc.Served("x", "x", "eagle", target="mimo")


def test_tokenizers_and_reference_servers_are_where_the_options_need_them():
    """vLLM renders logprobs only with a tokenizer and compiles a grammar only with one whose strings spell it:
    the logprob rows use the id tokenizer and a reference server, the schema rows the character tokenizer."""
    for config in vs.CONFIGS:
        argv = vs.serve_argv(config, MODELS)
        assert config.reference == (config.options in (vc.LOGPROBS, vc.REPETITION))
        if config.tokenizer:
            assert "--skip-tokenizer-init" not in argv and "--return-tokens-as-token-ids" in argv
            expected = {"ids": (vc.LOGPROBS, "m/tokenizer"), "characters": (vc.SCHEMA, "m/characters")}
            assert (config.options, _flag(argv, "--tokenizer")) == expected[config.tokenizer]
        else:
            assert "--skip-tokenizer-init" in argv and "--tokenizer" not in argv
    assert sorted(c.tokenizer for c in vs.CONFIGS if c.tokenizer) == ["characters"] * 7 + ["ids"] * 7
    argv = vs.audit_argv(port=8011, seed=0, tier="smoke", num_samples=None, out=Path("x"), reference_port=8012)
    assert _flag(argv, "--reference-endpoint") == "http://127.0.0.1:8012"


def test_the_word_level_tokenizer_names_each_id(tmp_path):
    pytest.importorskip("tokenizers")
    from transformers import AutoTokenizer

    path = vs.write_tokenizer(tmp_path / "tokenizer", [f"<t{i}>" for i in range(32)])
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert len(tokenizer) == 32 and tokenizer.convert_ids_to_tokens([0, 7, 31]) == ["<t0>", "<t7>", "<t31>"]
    assert tokenizer("<t3> <t30>")["input_ids"] == [3, 30] and tokenizer.eos_token_id is None
    with pytest.raises(ValueError, match="distinct"):
        vs.write_tokenizer(tmp_path / "twice", ["a", "a"])


def test_the_character_tokenizer_is_the_grammars_vocabulary_as_vllm_reads_it(tmp_path):
    """vLLM builds xgrammar's tokenizer info with ``TokenizerInfo.from_huggingface(tokenizer, vocab_size=V)``
    and adds the tokenizer's end-of-sequence id to the grammar's stop tokens: read that way, the character
    tokenizer is the audit's vocabulary (raw strings, stop ``</s>`` = V - 1), so the masks agree."""
    pytest.importorskip("tokenizers")
    xgr = pytest.importorskip("xgrammar")
    from transformers import AutoTokenizer

    from specverify_reference.grammar import STOP_TEXT, Grammar, grammar_bitmask, synthetic_vocabulary
    from specverify_reference.penalties import History

    V = 32
    tokenizer = AutoTokenizer.from_pretrained(
        vs.write_tokenizer(tmp_path / "c", synthetic_vocabulary(V), eos=STOP_TEXT)
    )
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=V)
    assert info.vocab_type == xgr.VocabType.RAW and tokenizer.eos_token_id == V - 1
    assert [t.decode() for t in info.decoded_vocab] == list(synthetic_vocabulary(V))
    schema = Grammar("json_schema", _flag(list(vc.SCHEMA), "--json-schema"))
    compiled = xgr.GrammarCompiler(info).compile_json_schema(schema.source, any_whitespace=True)
    text = '{"name": "ab'
    ids = [synthetic_vocabulary(V).index(c) for c in text]
    history = History(torch.tensor([[0, *ids]]), 1, torch.arange(1, len(ids) + 1)[None])  # law j after ids[:j]
    ours = grammar_bitmask(schema, history, V)  # (1, n, W)
    matcher = xgr.GrammarMatcher(compiled, override_stop_tokens=[tokenizer.eos_token_id])
    for j, token in enumerate(ids):
        theirs = xgr.allocate_token_bitmask(1, V)
        matcher.fill_next_token_bitmask(theirs, 0)
        assert torch.equal(theirs[0], ours[0, j]), (j, text[:j])
        assert matcher.accept_token(token)


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


def test_a_dead_servers_root_cause_is_read_from_its_log(tmp_path):
    """The worker's exception, not the harmless start-up warning nor the engine's wrappers after it."""
    log = tmp_path / "server.log"
    log.write_text(
        "(APIServer pid=1) WARNING 12-07 13:40:44 [base.py:380] ValueError: Tokenizer not available\n"
        "(Worker pid=2) ERROR 12-07 13:40:50 [multiproc_executor.py:1063] Traceback (most recent call last):\n"
        "(Worker pid=2) ERROR 12-07 13:40:50 [multiproc_executor.py:1063]     top_k_mask = logits_sort.gather(1, k)\n"
        "(Worker pid=2) ERROR 12-07 13:40:50 [multiproc_executor.py:1063] RuntimeError: index -288 is out of bounds\n"
        "(EngineCore pid=3) ERROR 12-07 13:40:50 [core.py:1512] RuntimeError: Worker failed with error 'index'\n"
        "(APIServer pid=1) ERROR 12-07 13:40:50 [async_llm.py:906] vllm.v1.engine.exceptions.EngineDeadError: x\n"
    )
    assert vs.server_error(log) == "RuntimeError: index -288 is out of bounds"
    assert vs.server_error(tmp_path / "absent.log") is None
    log.write_text("(APIServer pid=1) WARNING x [base.py:380] ValueError: Tokenizer not available\n")
    assert vs.server_error(log) is None
    log.write_text(
        "(APIServer pid=1) ERROR 12-07 14:02:40 [repo_utils.py:126] Error parsing config for m/characters: x\n"
        "(EngineCore pid=2) ERROR 12-07 14:03:22 [scheduler.py:2189] Unexpected: grammar rejected tokens [0].\n"
    )
    assert vs.server_error(log) == "Unexpected: grammar rejected tokens [0]."


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
    assert vr._acceptance(counters) == "12 / 1,020 (1.2 %); position 1: 3.2 %"
    assert vs.spec_decode_counters("vllm:num_requests_running 0.0\n") is None
    assert vr._acceptance(None) == "-"
    one = {"distinct_prefix_laws": 1, "teacher_forcing_requests": 1, "laws_per_request": 1.0}
    assert vr._memo({"memo": one}) == "1.00 (1 law / 1 request)" and vr._memo({"memo": None}) == "-"


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
    """The whole path -- serve the server under test and its reference, wait, audit (the laws from the
    reference, prompt logprobs compared), report, run.json, stop both -- with the local test server in
    place of vLLM."""
    port = _free_port()
    while vs.port_answers(port + 1):
        port = _free_port()

    def local(config, models, port):
        return ["python", "-m", "specverify.endpoint.localserver", "--port", str(port), "--max-logprobs", "-1",
                "--model-name", vs.MODEL, "--no-speculation"]  # fmt: skip

    monkeypatch.setattr(vs, "serve_argv", local)
    config = BY_NAME["control_no_spec_logprobs"]
    out, scratch = tmp_path / "out", tmp_path / "scratch"
    record = vs.run_config(config, MODELS, out=out, scratch=scratch, seed=0, tier="smoke", num_samples=200,
                           port=port, ready_timeout=60.0)  # fmt: skip
    assert record["error"] is None, record["error"]
    report = json.loads((out / config.name / "report.json").read_text())
    assert report["verdict"] in ("pass", "suspicious")
    assert report["command"].startswith(f"specverify audit --endpoint http://127.0.0.1:{port} --model {vs.MODEL}")
    assert f"--reference-endpoint http://127.0.0.1:{port + 1}" in report["command"]
    assert f"--port {port + 1}" in record["reference_serve_command"]
    fidelity = report["extra"]["logprob_fidelity"]
    assert fidelity["verdict"] == fidelity["prompt"]["verdict"] == "pass", fidelity
    assert fidelity["prompt"]["tokens_checked"] > 0 and fidelity["prompt"]["top_entries_checked"] > 0, fidelity
    assert record["spec_decode"] is None  # the local server has no /metrics
    assert record["samples"]["committed"] and (out / config.name / "samples.jsonl").exists()
    assert json.loads((out / config.name / "run.json").read_text())["audit_command"] == report["command"]
    assert not vs.port_answers(port) and not vs.port_answers(port + 1)  # both servers were stopped


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
    assert args.max_logprobs == -1 and args.skip_tokenizer_init == (args.tokenizer is None), line
    assert args.enforce_eager, line
    assert args.dtype == "float32" and args.max_model_len == 128 and args.port == 8000, line
    assert args.speculative_config == (None if spec is None else json.loads(spec)), (args.speculative_config, line)
print("ok")
"""
    lines = [vs.serve_line(vs.serve_argv(c, MODELS)) for c in vs.CONFIGS]
    lines += [vs.serve_line(vs.serve_argv(dataclasses.replace(c, method=None), MODELS)) for c in vs.CONFIGS]
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
