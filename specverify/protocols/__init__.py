"""The protocols an implementation under test speaks, enforced: chain verifiers, tree verifiers, uniforms-in kernels.

``chain`` (``verify(target_probs, draft_probs, draft_tokens, *, generator)``: calls, output
validation, determinism), ``tree`` (tree batches, their validation, tree-verifier calls and
outputs), ``uniforms`` (kernels that take their coins as tensors or a seed/offset pair, turned
into protocol verifiers).  This floor imports only :mod:`specverify.core`.
"""
