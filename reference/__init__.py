"""Reference implementations of speculative decoding, used as the baseline by specverify.

Modules
-------
sampling    exact, fast categorical sampling with an explicit ``torch.Generator``
rules       the canonical chain verifier (Leviathan et al. 2023; Chen et al. 2023) and greedy verification
processors  temperature, top-k, top-p, min-p as pure functions; SamplingConfig
models      a tiny causal transformer with a truncatable KV cache, target/drafter pairs, an n-gram drafter
decoder     batched speculative decoding: draft K, verify in one target pass, roll KV caches back
direct      plain autoregressive target sampling (the baseline) and the exact-conditional target adapter
"""
