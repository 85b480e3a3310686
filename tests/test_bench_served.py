"""tools.reports.bench_served: its configurations, commands and table (the servers themselves run where engines are)."""

from __future__ import annotations

import json

from tools.reports.bench_served import CONFIGS, END, START, bench_argv, render_table, update_readmes


def test_every_row_benches_an_audited_configuration_at_the_issues_concurrencies(tmp_path):
    for config in CONFIGS:
        argv = bench_argv(config, port=9000, model="m", pairs=6, reports=tmp_path, out=tmp_path / config.name)
        at = argv.index("--concurrency")
        assert argv[at + 1 : at + 4] == ["1", "4", "16"]
        assert argv[argv.index("--audit-report") + 1].endswith(f"{config.audit}/report.json")
    assert len({c.name for c in CONFIGS}) == len(CONFIGS)
    assert {c.kind for c in CONFIGS} == {"local", "llama-server", "vllm"}


def test_the_table_states_verdict_and_speedup_side_by_side(tmp_path):
    config = CONFIGS[0]
    (tmp_path / config.name).mkdir()
    (tmp_path / config.name / "run.json").write_text(json.dumps({"error": None}))
    level = {"speedups": {"tokens_per_s": {"estimate": 1.5, "low": 1.4, "high": 1.6}},
             "counters": {"mean_acceptance_length": 2.25, "acceptance_rate": 0.4}}  # fmt: skip
    bench = {"audit": {"verdict": "pass", "detectable_tv": 0.0613},
             "levels": [{"concurrency": 1, **level}, {"concurrency": 16, **level}],
             "predictions": [{"speedup": 1.9, "accelerator": "H100 SXM"}]}  # fmt: skip
    (tmp_path / config.name / "bench.json").write_text(json.dumps(bench))
    table = render_table(tmp_path)
    row = next(line for line in table.splitlines() if config.name in line)
    assert "**PASS** | 0.0613 | 1.50 [1.40, 1.60] | 1.50 [1.40, 1.60] | 2.25 tokens/step | 1.90 (H100 SXM)" in row
    assert "| not run |" in next(line for line in table.splitlines() if CONFIGS[1].name in line)
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "README.md").write_text(f"# Reports\n{START}\nold\n{END}\nafter\n")
    update_readmes(tmp_path, reports)
    text = (reports / "README.md").read_text()
    assert "old" not in text and "after" in text and f"(bench/{config.name}/bench.md)" in text
    assert f"({config.name}/bench.md)" in (tmp_path / "README.md").read_text()  # links relative to reports/bench
