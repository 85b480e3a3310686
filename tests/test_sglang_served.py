"""The SGLang report generator without SGLang: its commands, the import shim, the log reading, the probes
against a stand-in ``/generate`` server, the README and the engine matrix rows it feeds."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tools.reports import matrix
from tools.reports import sglang_readme as sr
from tools.reports import sglang_served as ss
from tools.reports.vllm_served import Models

MODELS = Models(*(Path(f"m/{name}") for name in ("target", "draft", "eagle", "tokenizer", "characters", "eagle3",
                                                  "mimo")))  # fmt: skip


def test_each_configuration_serves_its_models_with_its_speculation():
    lines = {c.name: ss.serve_argv(c, MODELS, python="py", port=1) for c in ss.CONFIGS}
    assert "--speculative-algorithm" not in lines["control_no_spec"]
    for config in ss.CONFIGS:
        argv = lines[config.name]
        assert argv[:3] == ["py", "-m", "sglang.launch_server"]
        assert argv[argv.index("--model-path") + 1] == f"m/{config.target}"
        assert argv[argv.index("--device") + 1] == "cpu"
        if config.algorithm is not None:
            assert argv[argv.index("--speculative-algorithm") + 1] == config.algorithm
        if config.draft is not None:
            assert argv[argv.index("--speculative-draft-model-path") + 1] == f"m/{config.draft}"
    assert lines["mtp_mimo_k1"][lines["mtp_mimo_k1"].index("--model-path") + 1] == "m/mimo"
    assert "--speculative-use-rejection-sampling" in lines["eagle_k3_rejection"]
    recorded = ss.serve_line(lines["eagle_k3"])
    assert recorded.startswith("SGLANG_USE_CPU_ENGINE=1 PYTHONPATH=tools/reports/sglang_shim python -m sglang")


def test_the_shim_imports_every_name_and_each_op_raises_naming_itself():
    code = ("import sgl_kernel\nfrom sgl_kernel import copy_all_layer_kv_cache_cpu as op\n"
            "try:\n    op(1)\nexcept NotImplementedError as e:\n    print(e)\n"
            "try:\n    import sgl_kernel.speculative\nexcept ImportError as e:\n    print(type(e).__name__)\n")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(Path(ss.SHIM).resolve())})  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "sgl_kernel.copy_all_layer_kv_cache_cpu is an SGLang CPU kernel op: the sgl_kernel import shim has none",
        "ModuleNotFoundError",
    ]


def test_the_root_cause_is_the_last_exception_and_the_frame_that_raised_it(tmp_path):
    log = tmp_path / "server.log"
    assert ss.root_cause(log) is None
    log.write_text(
        "[t] Ignore import error when loading x: No module named 'cutlass'\n"
        "Traceback (most recent call last):\n"
        '  File "/v/lib/python3.11/site-packages/sglang/srt/a.py", line 5, in outer\n'
        "    inner()\n"
        '  File "/v/lib/python3.11/site-packages/sglang/kernels/b.py", line 191, in copy_func\n'
        "    op()\n"
        '  File "/repo/tools/reports/sglang_shim/sgl_kernel/__init__.py", line 19, in op\n'
        '    raise NotImplementedError(f"{module}.{name} is ...")\n'
        "NotImplementedError: sgl_kernel.copy_op is an SGLang CPU kernel op\n"
        "[t] Error: /bin/sh: 1: py-spy: not found\n"
    )
    assert ss.root_cause(log) == (
        "NotImplementedError: sgl_kernel.copy_op is an SGLang CPU kernel op (sglang/kernels/b.py:191 in copy_func)"
    )


class _Generate(BaseHTTPRequestHandler):
    """A stand-in ``/generate``: seeds ignored (a counter moves the tokens), ``top_logprobs_num`` up to V = 4
    answered with a uniform law, beyond it the connection dropped (as SGLang's scheduler dies)."""

    calls = 0

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).calls += 1
        top = body.get("top_logprobs_num")
        if top is not None and top > 4:
            self.connection.close()
            return
        reply: dict = {"output_ids": [type(self).calls % 4] * body["sampling_params"]["max_new_tokens"]}
        if top is not None:
            row = [[math.log(0.25), i, None] for i in range(top)]
            reply["meta_info"] = {"input_top_logprobs": [None, row, row]}
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def generate_server():
    server = ThreadingHTTPServer((ss.HOST, 0), _Generate)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_the_probes_record_answers_seeds_logprobs_and_the_over_vocabulary_request(generate_server, tmp_path):
    port = generate_server.server_address[1]
    probes = ss.probe(port, 4, tmp_path / "none.log", settle=0.0)
    assert probes["sampled"]["ok"] and len(probes["sampled"]["output_ids"]) == 8
    assert probes["seeded"]["ok"] and probes["seeded"]["same"] is False
    assert probes["top_logprobs_vocab"] == {"ok": True, "positions": 2, "entries": [4], "probability_sums": [1.0, 1.0]}
    over = probes["top_logprobs_over_vocab"]
    assert over["ok"] is False and "RemoteDisconnected" in over["error"]
    assert over["server_answers_after"] is True  # the stand-in survives; SGLang 0.5.23 does not


def _write_run(out: Path, name: str, record: dict) -> None:
    (out / name).mkdir(parents=True)
    (out / name / "run.json").write_text(json.dumps({"name": name, "wall_seconds": 30, **record}))


def test_readme_and_matrix_rows_come_from_the_records(tmp_path):
    out = tmp_path / "sglang"
    probes = {"sampled": {"ok": True}, "seeded": {"ok": True, "same": False},
              "top_logprobs_vocab": {"ok": True, "entries": [32], "probability_sums": [1.0, 0.99999]},
              "top_logprobs_over_vocab": {"ok": False, "server_answers_after": False,
                                          "logged": "RuntimeError: selected index k out of range (x.py:1 in f)"}}  # fmt: skip
    _write_run(out, "control_no_spec", {"started": True, "startup_seconds": 20, "error": None, "probes": probes,
                                        "not_audited": "no dialect", "serve_command": "S0"})  # fmt: skip
    _write_run(out, "eagle_k3", {"started": False, "error": "does not start: ValueError: no (d.py:64 in f)",
                                 "serve_command": "S1"})  # fmt: skip
    text = sr.render_readme(out, ss.CONFIGS)
    assert (
        "| `control_no_spec` | control: no speculation | yes | answers | **different** | 32 entries, sums 1.0000-1.0000 | server **dies** | 20 s |"
        in text
    )
    assert "| `eagle_k3` | EAGLE-1 head (EAGLE), K=3 | **no** | - | - | - | - | - |" in text
    assert "- `eagle_k3` does not start: ValueError: no (d.py:64 in f)" in text
    assert "RuntimeError: selected index k out of range" in text
    assert "--only control_no_spec --only eagle_k3" in text  # a subset: the regenerate command names it
    rows = {r["configuration"]: r for r in matrix.matrix_rows(tmp_path) if r["engine"] == "SGLang"}
    assert rows["control_no_spec"]["verdict"] == "not audited" and "no dialect" in rows["control_no_spec"]["options"]
    assert rows["eagle_k3"]["verdict"] == "not run" and "ValueError: no" in rows["eagle_k3"]["options"]
