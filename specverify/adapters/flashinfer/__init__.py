"""FlashInfer's ``chain_speculative_sampling`` (package flashinfer-python) behind the chain-verifier protocol.

``chain`` adapts both kernel signatures (``uniform_samples`` up to v0.2.5, Philox
``seed``/``offset`` later), chosen from the installed one.  Written against flashinfer-python
0.6.0, the version the accelerator check installs (``benchmarks/gpu``: its dry run imports the
kernel and takes the seed/offset form); flashinfer is imported inside functions, so this package
imports without it and without a GPU.
"""

from specverify.adapters.flashinfer.chain import flashinfer_chain, flashinfer_chain_verifier

__all__ = ["flashinfer_chain", "flashinfer_chain_verifier"]
