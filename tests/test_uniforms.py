"""Uniforms-in and seed/offset chain kernels: the adapters, the reference kernel, the mutant."""

from __future__ import annotations

import pytest
import torch

import specverify as sv
from specverify.core.errors import InvalidArgument
from specverify.mutants import by_name
from specverify.protocols.uniforms import draw_chain_uniforms, draw_seed_offset, seed_offset_in, uniforms_in
from specverify.selftest.entry_scenarios import MUTANT_SCENARIOS
from specverify_reference.rules import verify as reference_verify
from specverify_reference.uniforms import chain_kernel, verify, verify_seed_offset


def _inputs(B=512, K=3, V=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    target = torch.softmax(2 * torch.randn(B, K + 1, V, generator=g), -1)  # (B, K+1, V)
    draft = torch.softmax(2 * torch.randn(B, K, V, generator=g), -1)  # (B, K, V)
    tokens = torch.multinomial(draft.view(-1, V), 1, generator=g).view(B, K)  # (B, K)
    return target, draft, tokens


def test_draw_chain_uniforms_layout_and_dtypes():
    g = torch.Generator().manual_seed(0)
    u = draw_chain_uniforms(5, 3, generator=g)
    assert u.shape == (5, 4) and u.dtype == torch.float64
    u32 = draw_chain_uniforms(10_000, 3, generator=g, dtype=torch.float32)
    assert u32.dtype == torch.float32 and bool(((u32 >= 0) & (u32 < 1)).all())
    with pytest.raises(InvalidArgument, match="dtype"):
        draw_chain_uniforms(2, 2, generator=g, dtype=torch.bfloat16)
    a = draw_seed_offset(generator=torch.Generator().manual_seed(3))
    assert a == draw_seed_offset(generator=torch.Generator().manual_seed(3)) and a[1] % 4 == 0


def test_adapters_validate_and_are_deterministic():
    with pytest.raises(InvalidArgument, match="kernel"):
        uniforms_in(3)
    with pytest.raises(InvalidArgument, match="kernel"):
        seed_offset_in(None)
    with pytest.raises(InvalidArgument, match="dtype"):
        uniforms_in(chain_kernel, dtype=torch.float16)
    target, draft, tokens = _inputs()
    for v in (verify, verify_seed_offset):
        a = v(target, draft, tokens, generator=torch.Generator().manual_seed(1))
        b = v(target, draft, tokens, generator=torch.Generator().manual_seed(1))
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        with pytest.raises(InvalidArgument, match="generator"):
            v(target, draft, tokens, generator=None)
    assert verify.kernel is chain_kernel
    with pytest.raises(InvalidArgument, match="uniforms"):
        chain_kernel(target, draft, tokens, uniforms=torch.ones(512, 4))


def test_kernel_follows_its_coins():
    """Coin 0 accepts every draft with p > 0 (the bonus then uses the last coin); coin just below 1 rejects
    the first draft wherever q(x) > p(x)."""
    target, draft, tokens = _inputs(B=256, K=2, V=5, seed=4)
    zeros = torch.zeros(256, 3, dtype=torch.float64)
    out, n = chain_kernel(target, draft, tokens, uniforms=zeros)
    assert bool((n == 3).all()) and torch.equal(out[:, :2], tokens)
    # last coin 0: the bonus is the first token of positive weight
    assert torch.equal(out[:, 2], (target[:, 2] > 0).long().argmax(-1))
    ones = torch.full((256, 3), 1 - 2**-53, dtype=torch.float64)
    _, n = chain_kernel(target, draft, tokens, uniforms=ones)
    p = target[:, 0].gather(1, tokens[:, :1]).squeeze(1)
    q = draft[:, 0].gather(1, tokens[:, :1]).squeeze(1)
    assert torch.equal(n == 1, (ones[:, 0] * q.double() >= p.double()))


def test_same_law_as_the_reference_rule():
    """One fixed (p, q) on V = 4, 200k rows: the first emitted token's frequencies agree with the reference."""
    B, V = 200_000, 4
    p = torch.tensor([0.1, 0.2, 0.3, 0.4]).expand(B, 2, V).contiguous()
    q = torch.tensor([0.4, 0.3, 0.2, 0.1]).expand(B, 1, V).contiguous()
    tokens = torch.multinomial(q[:, 0], 1, generator=torch.Generator().manual_seed(0))  # (B, 1)
    ours = verify(p, q, tokens, generator=torch.Generator().manual_seed(1))[0][:, 0]
    ref = reference_verify(p, q, tokens, generator=torch.Generator().manual_seed(2))[0][:, 0]
    f_ours = torch.bincount(ours, minlength=V).double() / B
    f_ref = torch.bincount(ref, minlength=V).double() / B
    assert (f_ours - p[0, 0].double()).abs().max() < 5e-3 and (f_ref - f_ours).abs().max() < 6e-3


@pytest.mark.parametrize("which", ["verify", "verify_seed_offset"])
def test_reference_kernel_passes_the_battery(which):
    impl = {"verify": verify, "verify_seed_offset": verify_seed_offset}[which]
    report = sv.check_verifier(impl, tier="smoke", seed=0, scenarios=["pos8_uniform_k4", "markov8_temperature_k2"])
    assert report.passed and report.verdict == "pass", report.verdict


def test_reuse_rejected_mutant_is_killed_at_smoke():
    entry = by_name("uniforms_reuse_rejected")
    assert entry.kind == "verifier" and by_name("uniforms_in_canonical").kind == "equivalent"
    report = sv.check_verifier(
        entry.fn, tier="smoke", seed=0, scenarios=list(MUTANT_SCENARIOS["uniforms_reuse_rejected"])
    )
    assert report.verdict == "fail" and not report.passed
