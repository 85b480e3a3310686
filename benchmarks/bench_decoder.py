"""Throughput of the reference speculative decoder vs direct sampling (a script, not a test).

For the same seeded target (and its early-exit drafter, or the n-gram drafter)
and each batch size, prints new tokens/s of direct autoregressive sampling and
of speculative decoding for each K, with the mean tokens per target pass
(accepted length + 1), target passes per kept token and the per-position
acceptance rates.  Each timing is the median of a few repeats after a warm-up.
On a shared CPU the numbers are noisy; on CPU the verification pass over K+1
positions costs about K+1 single steps, so speculative decoding only pays off
where a forward pass is latency bound (small batches, GPUs).

Usage: python benchmarks/bench_decoder.py [--device cpu|cuda] [--dtype float32|bfloat16]
       [--batch 1 16 256] [--k 2 4] [--max-new 64] [--vocab 64] [--d-model 64] [--layers 4]
       [--draft-layers 1] [--threads 2] [--repeats 3] [--ngram]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specverify_reference.decoder import SpeculativeDecoder
from specverify_reference.direct import DirectSampler
from specverify_reference.models import NGramDrafter, make_pair
from specverify_reference.processors import SamplingConfig


def timed(fn, repeats: int, device: str):
    fn()  # warm-up
    times, result = [], None
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        result = fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16, 256])
    parser.add_argument("--k", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--max-new", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=64)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--layers", type=int, default=4, help="target layers")
    parser.add_argument("--draft-layers", type=int, default=1, help="early-exit drafter layers")
    parser.add_argument("--prompt-len", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--ngram", action="store_true", help="also time the n-gram (prompt lookup) drafter")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    target, drafter = make_pair(
        vocab_size=args.vocab,
        seed=0,
        device=args.device,
        dtype=dtype,
        d_model=args.d_model,
        n_layers=args.layers,
        draft_layers=args.draft_layers,
    )
    sampling = SamplingConfig(temperature=args.temperature)
    cfg = target.config
    print(
        f"# device={args.device} dtype={args.dtype} threads={torch.get_num_threads()} V={cfg.vocab_size} "
        f"d={cfg.d_model} target layers={cfg.n_layers} drafter=early exit after {len(drafter.blocks)} "
        f"layer(s), prompt={args.prompt_len}, new tokens={args.max_new}, {sampling}"
    )
    print(
        f"{'decoder':<18}{'B':>6}{'K':>4}{'tok/s':>12}{'speedup':>9}{'tok/pass':>10}{'passes/tok':>12}  acceptance by position"
    )
    drafters = [("spec early-exit", drafter)] + ([("spec n-gram", NGramDrafter(args.vocab))] if args.ngram else [])
    prompt_gen = torch.Generator().manual_seed(0)
    for B in args.batch:
        prompts = torch.randint(0, args.vocab, (B, args.prompt_len), generator=prompt_gen).to(args.device)

        def gen():
            return torch.Generator(device=args.device).manual_seed(1)

        direct = DirectSampler(target, sampling)
        seconds, _ = timed(
            lambda: direct.generate_batch(prompts, args.max_new, generator=gen()), args.repeats, args.device
        )
        base = B * args.max_new / seconds
        print(f"{'direct':<18}{B:>6}{'-':>4}{base:>12.0f}{1.0:>9.2f}{1.0:>10.2f}{1.0:>12.3f}")
        for name, dr in drafters:
            for k in args.k:
                dec = SpeculativeDecoder(target, dr, k=k, sampling=sampling)
                seconds, result = timed(
                    lambda: dec.generate_batch(prompts, args.max_new, generator=gen()), args.repeats, args.device
                )
                s = result.stats
                rate = B * args.max_new / seconds
                acc = " ".join(f"{a:.2f}" for a in s.acceptance_rate)
                print(
                    f"{name:<18}{B:>6}{k:>4}{rate:>12.0f}{rate / base:>9.2f}{s.tokens_per_pass:>10.2f}"
                    f"{s.target_passes_per_token:>12.3f}  {acc}"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
