"""Reference implementations of speculative decoding, used as the baseline by specverify.

Modules
-------
sampling  exact, fast categorical sampling with an explicit ``torch.Generator``
rules     the canonical chain verifier (Leviathan et al. 2023; Chen et al. 2023) and greedy verification
"""
