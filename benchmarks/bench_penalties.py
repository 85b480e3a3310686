"""What penalties, a logit bias or a grammar cost the reference decoder and the exact analysis (a script, not a test).

For each vocabulary size, runs of the decoder core -- one prompt, ``--samples`` continuations of
8 tokens from the reference speculative decoder (float64 forward, K = 4), then the teacher-forced
conditionals of every sampled prefix summed block by block, as the exact analysis does -- plain
(temperature 1) and under vLLM's penalties (repetition 1.3, frequency 0.5, presence 0.3, a bias on
two ids), alternating plain / penalised so that a shared machine's drift cancels.  Prints one JSON
line per run and the time ratio penalised / plain: the geometric mean over the pairs with a 95% t
interval on the log ratios.  ``--variant structured`` times a JSON-schema grammar instead (vLLM's
law; the masks from xgrammar, every prefix replayed, for the decoder and the teacher-forced laws).

Usage: python benchmarks/bench_penalties.py [--vocab 64 32000] [--samples 500] [--pairs 3]
       [--variant penalised|structured] [--json benchmarks/results/penalties_paired.jsonl]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time

import torch
from scipy import stats

from specverify.decoder.protocol import summed_conditionals
from specverify_reference.decoder import SpeculativeDecoder
from specverify_reference.direct import TargetAdapter
from specverify_reference.grammar import Grammar
from specverify_reference.models import make_pair
from specverify_reference.processors import SamplingConfig

PLAIN = SamplingConfig(engine="vllm")
PENALISED = SamplingConfig(
    engine="vllm", repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.3, logit_bias={3: 2.0, 7: -1.0}
)
STRUCTURED = SamplingConfig(
    engine="vllm",
    grammar=Grammar(
        "json_schema", {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    ),
)
VARIANTS = {"penalised": PENALISED, "structured": STRUCTURED}


def run(V: int, sampling: SamplingConfig, samples: int) -> float:
    """Seconds for generation plus the summed teacher-forced conditionals."""
    target, drafter = make_pair(vocab_size=V, seed=0, dtype=torch.float64)
    prompt = torch.arange(1, 9) % V
    start = time.perf_counter()
    tokens = SpeculativeDecoder(target, drafter, k=4, sampling=sampling).generate(
        prompt, num_samples=samples, max_new_tokens=8, seed=0
    )
    total = summed_conditionals(TargetAdapter(target, sampling), prompt, tokens, V)
    assert torch.allclose(total.sum(-1), torch.full((8,), float(samples), dtype=torch.float64))
    return time.perf_counter() - start


def ratio_interval(ratios: list[float]) -> tuple[float, float, float]:
    logs = [math.log(r) for r in ratios]
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return math.exp(mean), math.nan, math.nan
    half = stats.t.ppf(0.975, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, nargs="+", default=[64, 32000])
    parser.add_argument("--samples", type=int, default=500)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--variant", choices=sorted(VARIANTS), default="penalised")
    parser.add_argument("--json", default=None, help="append the runs' JSON lines to this file")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    lines = []
    for V in args.vocab:
        ratios = []
        for pair in range(args.pairs):
            variant = VARIANTS[args.variant]
            seconds = {name: run(V, cfg, args.samples) for name, cfg in (("plain", PLAIN), (args.variant, variant))}
            ratios.append(seconds[args.variant] / seconds["plain"])
            line = {"vocab": V, "samples": args.samples, "pair": pair, **{k: round(v, 3) for k, v in seconds.items()}}
            lines.append(line)
            print(json.dumps(line), flush=True)
        mean, low, high = ratio_interval(ratios)
        print(
            f"V = {V:,}: {args.variant} / plain = {mean:.3f} [{low:.3f}, {high:.3f}] over {len(ratios)} pairs",
            flush=True,
        )
    if args.json:
        with open(args.json, "a") as handle:
            handle.writelines(json.dumps(line) + "\n" for line in lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
