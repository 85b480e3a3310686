"""Samples to detection: exact-conditional mode, two-sample mode and the MMD of Model Equality Testing, on the same samples.

Three planted deviations of the reference decoder's tiny model pair (V = 64, T = 0.7, one
prompt, L = 8 new tokens), each at one position ``j`` (the third new token) unless said:

* ``point_mass``: the law at position j is ``(1 - eps) p + eps delta_b`` (eps mass moved onto one
  token b);
* ``draft_leak``: the law at position j is ``(1 - w) p + w q`` (q the early-exit drafter's law,
  w = 0.01: 1% of the draft leaks through);
* ``bonus_temperature``: the speculative decoder (K = 4) draws its bonus token at temperature 1
  while the user asked 0.7 (every position where a round accepted all K drafts).

For each deviation and sample size N (continuations per prompt) and each of ``--seeds`` seeds:
the decoder battery in exact-conditional mode (``check_decoder(decoder, target)``), in
two-sample mode (``check_decoder(decoder, reference=direct sampling)``, 4 N reference samples)
and the MMD test with the Hamming kernel (``specverify.stats.mmd_hamming_test``, 200
permutations) on exactly the samples the two-sample mode used (the decoder's N and the
reference's 4 N).  All at alpha = 0.05 for the whole run.  A method's "samples to detection" is the
smallest N of the doubling grid at which it rejected in at least 90% (and 50%) of the seeds.

The endpoint audit sends these same requests over HTTP and runs the same battery on the replies
(transport changes no sample), so the comparison is run in process, on the models the local
server serves.

Run: python benchmarks/bench_endpoint_power.py [--seeds 10] [--max-n 32000] [--deviation NAME ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np
import torch

from specverify.core.machine import describe_machine
from specverify.core.sampling import sample
from specverify.core.seeds import derive_seed
from specverify.decoder.battery import check_decoder
from specverify.decoder.protocol import make_prompts
from specverify.stats.mmd import mmd_hamming_test
from specverify_reference.decoder import SpeculativeDecoder
from specverify_reference.direct import DirectSampler, TargetAdapter, generate_in_chunks
from specverify_reference.models import make_pair
from specverify_reference.processors import SamplingConfig, logits_to_probs

V, L, POSITION, TEMPERATURE, ALPHA = 64, 8, 2, 0.7, 0.05
SAMPLING = SamplingConfig(temperature=TEMPERATURE)
EPS_POINT_MASS, LEAK = 0.02, 0.01


class PlantedSampler:
    """Autoregressive sampling of the target with the law at one position changed (decoder protocol)."""

    def __init__(self, target, drafter, kind: str):
        self.target, self.drafter, self.kind = target, drafter, kind
        self.vocab_size, self.device, self.max_batch = V, target.device, 65536

    def generate_batch(self, prompts, max_new_tokens, *, generator):
        seq = prompts.long()
        out = []
        for t in range(max_new_tokens):
            with torch.no_grad():
                probs = logits_to_probs(self.target(seq)[:, -1], SAMPLING)  # (B, V)
                if t == POSITION and self.kind == "point_mass":
                    probs = (1 - EPS_POINT_MASS) * probs
                    probs[:, 5] += EPS_POINT_MASS
                elif t == POSITION and self.kind == "draft_leak":
                    q = logits_to_probs(self.drafter(seq)[:, -1], SAMPLING)  # (B, V)
                    probs = (1 - LEAK) * probs + LEAK * q
            token = sample(probs, generator=generator, check=False)  # (B,)
            out.append(token)
            seq = torch.cat([seq, token[:, None]], 1)
        return torch.stack(out, 1)

    def generate(self, prompt, *, num_samples, max_new_tokens, seed):
        return generate_in_chunks(self.generate_batch, prompt, num_samples=num_samples, max_new_tokens=max_new_tokens,
                                  seed=seed, vocab_size=V, device=self.device, max_batch=self.max_batch)  # fmt: skip


class BonusAtTemperatureOne(SpeculativeDecoder):
    """The bonus token (row K of the target's laws) at temperature 1 whatever the user asked."""

    def _target_probs(self, logits):
        probs = logits_to_probs(logits, self.sampling)  # (B, K+1, V)
        probs[:, -1] = logits_to_probs(logits[:, -1], dataclasses.replace(self.sampling, temperature=1.0))
        return probs


def decoder_for(kind: str, target, drafter):
    if kind == "bonus_temperature":
        return BonusAtTemperatureOne(target, drafter, k=4, sampling=SAMPLING)
    return PlantedSampler(target, drafter, kind)


def one_run(kind: str, n: int, seed: int, models, prompt, methods) -> dict:
    """Which of ``methods`` reject for one seed at N = ``n`` (the MMD on the two-sample mode's samples)."""
    target, drafter = models
    decoder = decoder_for(kind, target, drafter)
    reference = DirectSampler(target, SAMPLING)
    common = dict(prompts=[prompt], num_samples=n, max_new_tokens=L, seed=seed, alpha=ALPHA)
    out: dict = {}
    if "exact" in methods:
        out["exact"] = check_decoder(decoder, TargetAdapter(target, SAMPLING), **common).verdict == "fail"
    if "two_sample" in methods:
        out["two_sample"] = check_decoder(decoder, reference=reference, **common).verdict == "fail"
    if "mmd" in methods:
        x = decoder.generate(prompt, num_samples=n, max_new_tokens=L, seed=derive_seed(seed, 1, 0)).numpy()
        y = reference.generate(prompt, num_samples=4 * n, max_new_tokens=L, seed=derive_seed(seed, 4, 0)).numpy()
        generator = torch.Generator().manual_seed(derive_seed(seed, 5, 0))
        mmd = mmd_hamming_test([x], [y], vocab_size=V, permutations=200, alpha=ALPHA, generator=generator)
        out["mmd"] = bool(mmd.details["rejected"])
    return out


def main() -> None:
    global LEAK, EPS_POINT_MASS
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--min-n", type=int, default=250)
    parser.add_argument("--max-n", type=int, default=32000)
    parser.add_argument("--deviation", action="append", choices=("point_mass", "draft_leak", "bonus_temperature"))
    parser.add_argument("--leak", type=float, default=LEAK, help="draft_leak's weight w (default 0.01)")
    parser.add_argument("--eps", type=float, default=EPS_POINT_MASS, help="point_mass's eps (default 0.02)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    LEAK, EPS_POINT_MASS = args.leak, args.eps
    print(f"# {describe_machine()}; alpha {ALPHA}, V {V}, L {L}, T {TEMPERATURE}, "
          f"eps {EPS_POINT_MASS}, leak {LEAK}, {args.seeds} seeds")  # fmt: skip
    models = make_pair(vocab_size=V, seed=0)
    prompt = make_prompts(1, V, seed=0)[0]
    methods = ("exact", "two_sample", "mmd")
    rows = []
    for kind in args.deviation or ("point_mass", "bonus_temperature", "draft_leak"):
        found = {m: {} for m in methods}  # method -> {level: N}
        n = args.min_n
        while n <= args.max_n and any(0.9 not in found[m] for m in methods):
            todo = [m for m in methods if 0.9 not in found[m]]
            t0 = time.perf_counter()
            runs = [one_run(kind, n, seed, models, prompt, todo) for seed in range(args.seeds)]
            power = {m: float(np.mean([r[m] for r in runs])) for m in todo}
            shown = "  ".join(f"{m} {p:.1f}" for m, p in power.items())
            print(f"{kind:18s} N={n:6d} power {shown}  ({time.perf_counter() - t0:.0f} s)", flush=True)
            for m in todo:
                for level in (0.5, 0.9):
                    if power[m] >= level and level not in found[m]:
                        found[m][level] = n
            n *= 2
        rows.append((kind, found))
    print("\n| deviation | exact-conditional (0.5 / 0.9) | two-sample (0.5 / 0.9) | MMD, Hamming kernel (0.5 / 0.9) |")
    print("|---|---|---|---|")
    for kind, found in rows:
        cells = [" / ".join(str(f.get(level, f"> {args.max_n}")) for level in (0.5, 0.9)) for f in found.values()]
        print(f"| {kind} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
