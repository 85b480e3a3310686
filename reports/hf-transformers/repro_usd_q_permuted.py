"""Universal speculative decoding hands ``_speculative_sampling`` a q attached to the wrong tokens.

Standalone (torch + transformers).  With ``do_sample=True`` and different tokenizers, ``generate``
builds ``UniversalSpeculativeDecodingGenerator`` and an ``AssistantToTargetTranslator`` that prunes
the assistant's lm_head to the shared words (when the assistant has words the target lacks):

* the pruned head's row j is assistant id ``assistant_overlap_token_ids[j]``, in the order of
  ``target_to_assistant_input_ids.values()``, i.e. the iteration order of the tokenizer's
  ``get_vocab()`` dict (a Rust hash map for fast tokenizers: not sorted by id);
* ``get_target_ids`` maps a drafted row j through ``assistant_overlap_token_ids`` (right), but
  ``get_target_logits`` scatters column j to the target id of the j-th shared assistant id in
  *ascending id* order (``_assistant_to_target_input_ids[mask]``).

So the draft tokens follow one law while the q handed to the accept/residual step is the same
numbers attached to other tokens: the acceptance ratio p(x)/q(x) reads another token's draft
probability and the output is not the target's law.  Smallest configuration: word-level tokenizers,
target "w0".."w15", assistant the same words plus "x0".."x3" with ids in a shuffled order, a
1-layer V=20 Llama assistant.  The script feeds one hidden state through the pruned head and compares
the law of the draft (what ``generate`` samples, mapped to target ids as ``get_target_ids`` does) with
the q ``get_target_logits`` returns.  Exits 1 while they differ, 0 otherwise.  The hash-map order, hence
the printed ids and the size of the difference, changes from process to process.

Run, from any directory (exits 1 on transformers 5.24.0 and 5.25.0):
    pip install torch==2.13.0 transformers==5.24.0
    python repro_usd_q_permuted.py

Expected output (transformers 5.24.0, x86-64 CPU; exit status 1; the ids and the TV vary per process):
    transformers 5.24.0, torch 2.13.0+cpu
    pruned head rows are assistant ids [11, 8, 4, 18, 16, 15, 2, 19, 7, 6, 0, 10, 1, 5, 17, 14]
    get_target_logits puts pruned column j on target ids [4, 5, 13, 7, 14, 3, 6, 9, 11, 2, 10, 12, 15, 8, 1, 0]
    row j really is target id [2, 9, 7, 1, 15, 12, 13, 0, 6, 3, 4, 11, 5, 14, 8, 10]
    law of the drafts on target ids (= the unpruned assistant's law: max diff 5.6e-17): [0.218, 0.081, ...]
    q handed to _speculative_sampling:                 [0.002, 0.027, ...]
    total variation between them: 0.595
    BUG: the q verified is not the law the drafts were sampled from (exit 1)
"""

import sys

import torch
import transformers
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from transformers.generation.candidate_generator import AssistantToTargetTranslator


def tokenizer(words):
    tok = Tokenizer(WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token=words[0]))
    tok.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, clean_up_tokenization_spaces=False)


target_words = [f"w{i}" for i in range(16)]
assistant_words = target_words + [f"x{i}" for i in range(4)]
order = torch.randperm(len(assistant_words), generator=torch.Generator().manual_seed(0)).tolist()
assistant_words = [assistant_words[i] for i in order]
target_tok, assistant_tok = tokenizer(target_words), tokenizer(assistant_words)
config = LlamaConfig(vocab_size=len(assistant_words), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                     num_attention_heads=2, num_key_value_heads=1, bos_token_id=None, eos_token_id=None,
                     pad_token_id=None)  # fmt: skip
with torch.random.fork_rng():
    torch.manual_seed(0)
    assistant = LlamaForCausalLM(config).eval()
with torch.no_grad():
    assistant.lm_head.weight.mul_(15.0)  # peaked laws, as the audit's fixtures
full_head = assistant.lm_head.weight.detach().clone()  # (V_a, H), before pruning

translator = AssistantToTargetTranslator(target_tok, assistant_tok, 16, assistant_model=assistant,
                                         assistant_prune_lm_head=True)  # fmt: skip
hidden = torch.randn(1, 1, 32, generator=torch.Generator().manual_seed(1))  # (1, 1, H)
with torch.no_grad():
    pruned_logits = assistant.get_output_embeddings()(hidden)  # (1, 1, n_shared): what generate samples from
    q = torch.softmax(translator.get_target_logits(pruned_logits)[0, 0].double(), -1)  # (16,): what is verified
    draft_probs = torch.softmax(pruned_logits[0, 0].double(), -1)  # law of the drafted pruned row j
# a drafted row j becomes target token get_target_ids(j): accumulate the draft law on target ids
rows = torch.arange(draft_probs.numel())
draft_target_ids = translator._assistant_to_target_input_ids[translator.assistant_overlap_token_ids[rows]]
draft_law = torch.zeros(16, dtype=torch.float64).index_add_(0, draft_target_ids, draft_probs)
# the same law from the unpruned head directly (the assistant's own law over the shared words)
with torch.no_grad():
    full = (hidden[0, 0] @ full_head.T).double()  # (V_a,)
shared_ids = [assistant_tok.get_vocab()[w] for w in target_words]
check = torch.softmax(full[shared_ids], -1)

tv = 0.5 * float((draft_law - q).abs().sum())
print(f"transformers {transformers.__version__}, torch {torch.__version__}")
print(f"pruned head rows are assistant ids {translator.assistant_overlap_token_ids.tolist()}")
print(f"get_target_logits puts pruned column j on target ids "
      f"{translator._assistant_to_target_input_ids[translator._assistant_to_target_input_ids != -1].tolist()}")  # fmt: skip
print(f"row j really is target id {draft_target_ids.tolist()}")
print(f"law of the drafts on target ids (= the unpruned assistant's law: max diff "
      f"{float((draft_law - check).abs().max()):.1e}): {[round(x, 3) for x in draft_law.tolist()]}")  # fmt: skip
print(f"q handed to _speculative_sampling:                 {[round(x, 3) for x in q.tolist()]}")
print(f"total variation between them: {tv:.3f}")
if tv > 1e-6:
    print("BUG: the q verified is not the law the drafts were sampled from (exit 1)")
    sys.exit(1)
print("fixed: q is the law of the drafts")
