"""Tree-verifier adapter around EAGLE's verification (``eagle.model.utils`` of ``eagle-llm`` 1.2.1).

EAGLE (Li et al. 2024, arXiv 2401.15077; PyPI ``eagle-llm`` 1.2.1, the EAGLE-1 code of
SafeAILab/EAGLE) verifies a static draft tree per round.  The rule, read from the installed
sources (``eagle/model/utils.py``, ``eagle/model/cnets.py``):

* **Drafting** (``cnets.Model.topK_genrate`` / ``sample``): with sampling, each expanded node's
  children are ``torch.multinomial(q, 10, replacement=False)`` draws from the draft law ``q``
  after the same ``logits_processor`` as the target; a node's children in the tree are the
  first m of those draws (``mc_sim_7b_63``: every node's choices are 0..m-1), i.e. drawn
  **without replacement** -- the protocol's mode ``"wor"``.  The probability handed to the
  verifier for the i-th draw is its without-replacement conditional
  ``q(x_i) / (1 - sum_{j<i} q(x_j))`` (inf/nan set to -1, clamped to [0, 1]), together with the
  full ``q`` of every expanded node (``op``).  Greedy drafting takes ``torch.topk`` (mode ``"topk"``).
* **Verification** (``evaluate_posterior``, sampling branch): depth by depth from the root,
  ``gtp = softmax(logits_processor(target logits))`` at the accepted node; its children in
  tree order, skipping a token already tried (``candidates_set``), -1 padding and
  ``qx <= 0``: accept child x iff ``random.random() <= gtp[x] / qx`` (``qx`` the conditional
  above); on rejection ``q`` = the parent's draft law with the earlier siblings' tokens
  zeroed and renormalised (``b_indices``), ``gtp = normalise(max(gtp - q, 0))``.  This is
  recursive rejection sampling without replacement (correct for mode ``"wor"``).
* **Final token** (``evaluate_posterior``'s ``sample_p`` then ``update_inference_inputs``'s
  ``torch.multinomial(sample_p, 1)``): after a depth whose children were all rejected,
  the residual ``gtp``; otherwise (every depth accepted, or the accepted node has no
  children) ``softmax(logits[best_candidate, accept_length - 1])`` -- the target's **raw**
  logits, *without* ``logits_processor``: temperature, top-p and top-k are not applied to
  the bonus token.
* **Greedy** (temperature <= 1e-5: ``logits_processor`` is None): the longest path whose
  tokens equal ``argmax`` of the target logits (ties to the first path row), then
  ``argmax`` of the logits after it.
* ``prepare_logits_processor``: transformers' ``TemperatureLogitsWarper`` (T != 1), then
  ``TopPLogitsWarper`` (1e-8 <= top_p < 1), then ``TopKLogitsWarper`` (top_k > 0).

Layout: per protocol row, ``retrieve_indices`` (:func:`~specverify.adapters.layouts.to_eagle`,
tree position n+1 = node n), ``candidates = cart_candidates`` (:func:`~specverify.adapters.layouts.eagle_candidates`),
``logits = slot_logits[retrieve_indices]`` as ``tree_decoding`` builds them, the
without-replacement conditionals computed with ``cnets.sample``'s formula, ``op[d]`` = the
row's draft laws (indexed by ``p_indices`` = the parent's slot), ``b_indices`` = the slots
of each node's earlier siblings.  The target logits are ``temperature * log target_probs``,
so EAGLE's processor gives back the harness' (already processed) target law; top-k / top-p
must then cut nothing for the audit to be exact, which every call checks.  EAGLE runs one
sequence at a time, so rows are verified one by one (float32, on the CPU).

Randomness: EAGLE draws its coins from Python's global :mod:`random` and the final token from
torch's global CPU generator.  This adapter is the one allowed exception to "never global
RNG": every call draws one seed from the protocol's ``generator``, seeds ``random`` and
``torch.default_generator`` with it, and restores both states afterwards, so the same
generator gives the same output and the caller's global streams are untouched.

Install (its pinned dependencies are old; ``eagle.model.utils`` needs only torch and transformers)::

    pip install --no-deps eagle-llm==1.2.1

``import specverify.adapters.eagle`` never needs EAGLE; building a verifier without it raises
:class:`ImportError` naming that line.

Shapes: B batch, N nodes, V vocabulary, P paths (leaves) of a row, D maximum depth.
"""

from __future__ import annotations

import contextlib
import functools
import random
from collections.abc import Iterator
from types import SimpleNamespace

import torch

from specverify.adapters.layouts import eagle_candidates, from_eagle_outputs, to_eagle
from specverify.adapters.runtime import torch_threads
from specverify.core.errors import ImplementationError, InvalidArgument
from specverify.core.validation import check_bool, check_float, check_generator, check_int
from specverify.protocols.tree import PAD, ROOT, check_tree_inputs

__all__ = [
    "EagleTreeVerifier",
    "sampling_tree_verifier",
    "greedy_tree_verifier",
    "GreedyChainVerifier",
    "wor_conditionals",
    "seeded_global_rngs",
    "patched_evaluate_posterior",
    "INSTALL",
    "GREEDY_TEMPERATURE",
]

INSTALL = "pip install --no-deps eagle-llm==1.2.1"
#: ``eagenerate`` samples when ``temperature > 1e-5`` and is greedy otherwise.
GREEDY_TEMPERATURE = 1e-5
#: Largest total variation allowed between EAGLE's processed target law and ``target_probs``.
PROCESSOR_TOLERANCE = 1e-4


#: The line of ``evaluate_posterior`` that takes the final token's law from the raw logits.
RAW_FINAL_LINE = "gt_logits = logits[best_candidate, accept_length - 1]"
PATCHED_FINAL_LINE = "gt_logits = logits_processor(None, logits[best_candidate, accept_length - 1][None])[0]"


def _load_utils():
    try:
        from eagle.model import utils
    except ImportError as exc:
        raise ImportError(f"specverify.adapters.eagle needs the eagle-llm package and transformers: {INSTALL}") from exc
    return utils


def patched_evaluate_posterior(utils):
    """``evaluate_posterior`` with the final token's law processed (diagnostic): :data:`RAW_FINAL_LINE` replaced.

    Compiled from the installed source in the module's namespace; raises ImportError if that
    line is not found exactly once (another EAGLE version).
    """
    import inspect

    source = inspect.getsource(utils.evaluate_posterior)
    if source.count(RAW_FINAL_LINE) != 1:
        raise ImportError(f"patch_final: {RAW_FINAL_LINE!r} not found once in eagle.model.utils.evaluate_posterior")
    namespace = dict(vars(utils))
    exec(compile(source.replace(RAW_FINAL_LINE, PATCHED_FINAL_LINE), f"{utils.__file__} (patched)", "exec"), namespace)
    return namespace["evaluate_posterior"]


@contextlib.contextmanager
def seeded_global_rngs(seed: int) -> Iterator[None]:
    """Seed Python's :mod:`random` and torch's CPU default generator with ``seed``; restore both on exit."""
    python_state = random.getstate()
    torch_state = torch.default_generator.get_state()
    random.seed(seed)
    torch.default_generator.manual_seed(seed)
    try:
        yield
    finally:
        random.setstate(python_state)
        torch.default_generator.set_state(torch_state)


def wor_conditionals(draft_probs: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
    """The probability EAGLE's drafter hands over for every slot: (B, N+1) float32, 1 at the root.

    Node n, the i-th child of its parent slot m, gets ``q_m(x_n) / (1 - sum of q_m over its
    earlier siblings)`` computed as ``cnets.Model.sample`` does (float32, inf/nan -> -1,
    clamped to [0, 1]); padding nodes get 1 (EAGLE's value for -1 positions).
    """
    B, N = tokens.shape
    q = draft_probs.to(torch.float32)  # (B, N+1, V)
    out = torch.ones(B, N + 1, dtype=torch.float32)  # (B, N+1)
    real = parents != PAD  # (B, N)
    slot = (parents + 1).clamp(min=0)  # (B, N) parent slot
    qx = q[torch.arange(B)[:, None], slot, tokens.clamp(min=0)]  # (B, N)
    qx = torch.where(real, qx, 0.0)
    for n in range(N):
        earlier = real[:, :n] & (parents[:, :n] == parents[:, n : n + 1])  # (B, n) siblings before n
        before = (qx[:, :n] * earlier).sum(-1)  # (B,) EAGLE's exclusive cumsum
        value = qx[:, n] / (1 - before)
        value = torch.where(torch.isinf(value) | torch.isnan(value), -1.0, value).clamp(0.0, 1.0)
        out[:, n + 1] = torch.where(real[:, n], value, 1.0)
    return out


def _row_structure(parents_row: list[int], ri: torch.Tensor):
    """``p_indices`` and ``b_indices`` of one row, as ``evaluate_posterior`` reads them along ``ri`` (P, D+1)."""
    siblings: dict[int, list[int]] = {}
    earlier: dict[int, list[int]] = {}
    for n, parent in enumerate(parents_row):
        if parent == PAD:
            continue
        group = siblings.setdefault(parent, [])
        earlier[n + 1] = list(group)
        group.append(n + 1)
    p_indices: list[list[int]] = []
    b_indices: list[list[torch.Tensor | list]] = []
    for path in ri.tolist():
        p_row: list[int] = []
        b_row: list[torch.Tensor | list] = []
        for position in path:
            if position <= 0:
                p_row.append(-1 if position == 0 else 0)
                b_row.append([])
                continue
            parent = parents_row[position - 1]
            p_row.append(0 if parent == ROOT else parent + 1)
            b = earlier[position]
            b_row.append(torch.tensor(b, dtype=torch.long) if b else [])
        p_indices.append(p_row)
        b_indices.append(b_row)
    return p_indices, b_indices


class _DraftStub:
    """``model.ea_layer``: the next round's drafting (``topK_genrate``) is not part of the rule."""

    def topK_genrate(self, *args, **kwargs):
        return None


class EagleTreeVerifier:
    """EAGLE's ``evaluate_posterior`` and ``update_inference_inputs`` behind the tree-verifier protocol.

    Parameters
    ----------
    temperature : float >= 0, default 1.0
        ``eagenerate``'s temperature: above 1e-5 EAGLE samples with
        ``prepare_logits_processor(temperature, top_p=top_p, top_k=top_k)``; at or below it,
        greedy.  The logits handed over are ``temperature * log target_probs``.
    top_p : float in [0, 1], default 0.0
        EAGLE's top-p (applied when 1e-8 <= top_p < 1; 0 is EAGLE's "off").
    top_k : int >= 0, default 0
        EAGLE's top-k (0 is "off").
    patch_final : bool, default False
        Diagnostic: run :func:`patched_evaluate_posterior`, which applies ``logits_processor``
        to the final token's law too (isolates the raw-logits final draw).
    check_processor : bool, default True
        Raise if EAGLE's processor, applied to the logits, does not give back ``target_probs``
        (total variation above 1e-4): top-k / top-p that cut target mass make the audit test
        the cut, not EAGLE.
    num_threads : int or None, default 1
        torch intra-op threads during the row loop (restored afterwards).

    Notes
    -----
    Sampling verification supports mode ``"wor"`` (EAGLE draws children without replacement);
    the greedy rule reads only the target and accepts every mode.  See the module docstring
    for the rule and for the seeding of the global random streams.
    """

    def __init__(
        self,
        *,
        temperature: float = 1.0,
        top_p: float = 0.0,
        top_k: int = 0,
        patch_final: bool = False,
        check_processor: bool = True,
        num_threads: int | None = 1,
    ):
        self.temperature = check_float("temperature", temperature, minimum=0.0)
        self.top_p = check_float("top_p", top_p, minimum=0.0, maximum=1.0)
        self.top_k = check_int("top_k", top_k, minimum=0)
        self.patch_final = check_bool("patch_final", patch_final)
        self.check_processor = check_bool("check_processor", check_processor)
        self.num_threads = None if num_threads is None else check_int("num_threads", num_threads, minimum=1)
        self._utils = _load_utils()
        self.greedy = self.temperature <= GREEDY_TEMPERATURE
        self._evaluate_posterior = (
            patched_evaluate_posterior(self._utils) if patch_final else self._utils.evaluate_posterior
        )
        self.logits_processor = (
            None
            if self.greedy
            else self._utils.prepare_logits_processor(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k)
        )

    def __repr__(self) -> str:
        patch = ", patch_final=True" if self.patch_final else ""
        return f"EagleTreeVerifier(temperature={self.temperature:g}, top_p={self.top_p:g}, top_k={self.top_k}{patch})"

    def _logits(self, target_probs: torch.Tensor) -> torch.Tensor:
        """Target logits (B, N+1, V) float32 whose processed softmax is ``target_probs``."""
        scale = 1.0 if self.greedy else self.temperature
        logits = target_probs.to(torch.float32).log() * scale  # (B, N+1, V), log 0 = -inf
        if self.check_processor and self.logits_processor is not None:
            B, N1, V = logits.shape
            flat = logits.reshape(B * N1, V)  # (B*(N+1), V)
            processed = torch.softmax(self.logits_processor(None, flat.clone()), -1)  # (B*(N+1), V)
            target = target_probs.reshape(B * N1, V).double()  # (B*(N+1), V)
            target = target / target.sum(-1, keepdim=True)  # low-precision rows need not sum to 1
            tv = 0.5 * (processed.double() - target).abs().sum(-1)  # (B*(N+1),)
            worst = int(tv.argmax())
            if float(tv[worst]) > PROCESSOR_TOLERANCE:
                raise InvalidArgument(
                    f"top_p={self.top_p!r}, top_k={self.top_k!r}: EAGLE's processor moves the target law of row "
                    f"{worst // N1}, slot {worst % N1} by total variation {float(tv[worst]):.3g}; the audit is exact "
                    "only while top-k / top-p cut nothing (top_k >= V, top_p above the mass of the rarest tokens)"
                )
        return logits

    def verify_tree(self, target_probs, draft_probs, tokens, parents, *, mode, generator):
        """Verify each row with EAGLE's code; see :mod:`specverify.protocols.tree` for the contract.

        Returns
        -------
        emitted : Tensor (B, D+1) long
        num_emitted : Tensor (B,) long
        path : Tensor (B, D) long
        """
        B, N, V = check_tree_inputs(target_probs, draft_probs, tokens, parents, mode)
        check_generator("generator", generator)
        if not self.greedy and mode != "wor":
            raise InvalidArgument(
                f"mode must be 'wor' for EAGLE's sampling rule (children drawn without replacement), got {mode!r}"
            )
        device = target_probs.device
        target_probs, tokens, parents = target_probs.cpu(), tokens.cpu().long(), parents.cpu().long()
        ri = to_eagle(parents)  # (B, P, D+1)
        cart = eagle_candidates(tokens, ri)  # (B, P, D+1)
        slot_logits = self._logits(target_probs)  # (B, N+1, V)
        if self.greedy:
            slot_prob, q = None, None
        else:
            q = draft_probs.cpu().to(torch.float32)  # (B, N+1, V)
            slot_prob = torch.cat([wor_conditionals(q, tokens, parents), torch.ones(B, 1)], 1)  # (B, N+2)
        best = torch.empty(B, dtype=torch.long)
        accepted = torch.empty(B, dtype=torch.long)
        final = torch.empty(B, dtype=torch.long)
        seed = int(torch.randint(0, 2**62, (), generator=generator))
        structures: dict[tuple, tuple] = {}
        with torch_threads(self.num_threads), torch.no_grad(), seeded_global_rngs(seed):
            for b in range(B):
                key = tuple(parents[b].tolist())
                if key not in structures:
                    structures[key] = _row_structure(list(key), ri[b])
                p_indices, b_indices = structures[key]
                best[b], accepted[b], final[b] = self._row(b, slot_logits[b], ri[b], cart[b], tokens[b], q, slot_prob,
                                                           p_indices, b_indices)  # fmt: skip
        emitted, num_emitted, path = from_eagle_outputs(ri, best, accepted, final, tokens)
        return emitted.to(device), num_emitted.to(device), path.to(device)

    __call__ = verify_tree

    def _row(self, b, logits_row, ri, cart, tokens_row, q, slot_prob, p_indices, b_indices):
        """One row through ``evaluate_posterior`` and ``update_inference_inputs``: ``(best, accept_length, token)``."""
        utils = self._utils
        N1 = logits_row.shape[0]
        logits = logits_row[ri]  # (P, D+1, V) as tree_decoding's tree_logits[0, retrieve_indices]
        tree_candidates = torch.cat([torch.zeros(1, dtype=torch.long), tokens_row]).clamp(min=0)[None]  # (1, N+1)
        if q is None:
            cart_prob, op = None, None
        else:
            cart_prob = slot_prob[b][ri]  # (P, D+1); -1 picks the appended 1, as generate_candidates does
            op = [q[b]] * (ri.shape[1] - 1)  # op[d][p_indices] = the parent slot's draft law
        try:
            best, accept_length, sample_p = self._evaluate_posterior(
                logits, cart, self.logits_processor, cart_prob, op, p_indices, tree_candidates, b_indices
            )
            _, _, _, _, token = utils.update_inference_inputs(
                torch.zeros((1, 1), dtype=torch.long),  # input_ids: the committed prefix (one token)
                cart, best, accept_length, ri, self.logits_processor, logits, None, 0,
                [torch.zeros(1, N1 + 2, 1)], torch.zeros(1, dtype=torch.long),  # KV data, current length
                SimpleNamespace(ea_layer=_DraftStub(), base_model=SimpleNamespace(lm_head=None)),
                None, torch.zeros(1, N1, 1), sample_p,
            )  # fmt: skip
            return int(best), int(accept_length), int(token.reshape(-1)[0])
        except Exception as exc:  # the implementation under test failed
            raise ImplementationError(f"EAGLE raised on row {b}: {type(exc).__name__}: {exc}", row=b) from exc


@functools.cache
def _default(temperature: float) -> EagleTreeVerifier:
    return EagleTreeVerifier(temperature=temperature)


def sampling_tree_verifier(target_probs, draft_probs, tokens, parents, *, mode, generator):
    """EAGLE at temperature 1, no top-p/top-k: ``--tree-verifier specverify.adapters.eagle:sampling_tree_verifier --mode wor``."""
    return _default(1.0).verify_tree(target_probs, draft_probs, tokens, parents, mode=mode, generator=generator)


def greedy_tree_verifier(target_probs, draft_probs, tokens, parents, *, mode, generator):
    """EAGLE's greedy branch (temperature 0: ``logits_processor`` None) as a tree verifier (any mode)."""
    return _default(0.0).verify_tree(target_probs, draft_probs, tokens, parents, mode=mode, generator=generator)


class GreedyChainVerifier:
    """EAGLE's greedy branch on one-path trees as a chain verifier: ``--verifier ...:GreedyChainVerifier --greedy``.

    Parameters
    ----------
    num_threads : int or None, default 1
    """

    def __init__(self, *, num_threads: int | None = 1):
        from specverify.verifier.tree.chain import as_chain_verifier

        self.tree = EagleTreeVerifier(temperature=0.0, num_threads=num_threads)
        self.verify = as_chain_verifier(self.tree.verify_tree, mode="topk")

    def __repr__(self) -> str:
        return "GreedyChainVerifier(EagleTreeVerifier(temperature=0))"
