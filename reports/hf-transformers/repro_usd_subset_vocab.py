"""Universal speculative decoding raises when the assistant's vocabulary is a subset of the target's.

Standalone (torch + transformers).  ``generate(assistant_model=..., tokenizer=..., assistant_tokenizer=...,
do_sample=True)`` builds ``UniversalSpeculativeDecodingGenerator`` with an ``AssistantToTargetTranslator``
created with ``assistant_prune_lm_head=True``.  The translator sets ``assistant_overlap_token_ids`` only
when some assistant token is missing from the target's vocabulary, but ``get_target_ids`` indexes it
whenever ``assistant_prune_lm_head`` is set, so an assistant whose every token is a target token
(a smaller vocabulary of the same family) fails with ``AttributeError`` on the first drafting round.

Smallest configuration: two word-level tokenizers (target "w0".."w7"; assistant "w0".."w3"),
a 1-layer V=8 Llama target and a 1-layer V=4 Llama assistant, seeded, prompt "w1 w2", one new token
drafted with K = 1.  Greedy decoding (``AssistedCandidateGeneratorDifferentTokenizers``) is the control.
Exits 1 while sampling raises, 0 otherwise.

Run, from any directory (exits 1 on transformers 5.24.0 and 5.25.0):
    pip install torch==2.13.0 transformers==5.24.0
    python repro_usd_subset_vocab.py

Expected output (transformers 5.24.0, x86-64 CPU; exit status 1):
    transformers 5.24.0, torch 2.13.0+cpu
    target vocabulary ['w0', 'w1', 'w2', 'w3', 'w4', 'w5', 'w6', 'w7'], assistant vocabulary ['w0', 'w1', 'w2', 'w3']
    do_sample=False: generated 'w5 w5 w5'
    do_sample=True: AttributeError: 'AssistantToTargetTranslator' object has no attribute 'assistant_overlap_token_ids'
    BUG: sampling with an assistant vocabulary that is a subset of the target's raises (exit 1)
"""

import sys

import torch
import transformers
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast


def tokenizer(words):
    tok = Tokenizer(WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token=words[0]))
    tok.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, clean_up_tokenization_spaces=False)


def llama(vocab_size, seed):
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, bos_token_id=None, eos_token_id=None,
                         pad_token_id=None)  # fmt: skip
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return LlamaForCausalLM(config).eval()


target_tok, assistant_tok = tokenizer([f"w{i}" for i in range(8)]), tokenizer([f"w{i}" for i in range(4)])
target, assistant = llama(8, 0), llama(4, 1)
assistant.generation_config.num_assistant_tokens = 1
assistant.generation_config.assistant_confidence_threshold = 0.0
ids = target_tok("w1 w2", return_tensors="pt")["input_ids"]
print(f"transformers {transformers.__version__}, torch {torch.__version__}")
print(f"target vocabulary {sorted(target_tok.get_vocab())}, assistant vocabulary {sorted(assistant_tok.get_vocab())}")
broken = False
for do_sample in (False, True):
    torch.manual_seed(0)
    try:
        out = target.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=assistant, tokenizer=target_tok,
                              assistant_tokenizer=assistant_tok, do_sample=do_sample, max_new_tokens=3,
                              pad_token_id=0)  # fmt: skip
        print(f"do_sample={do_sample}: generated {target_tok.decode(out[0, ids.shape[1]:])!r}")
    except Exception as exc:  # the bug
        print(f"do_sample={do_sample}: {type(exc).__name__}: {exc}")
        broken = broken or do_sample
if broken:
    print("BUG: sampling with an assistant vocabulary that is a subset of the target's raises (exit 1)")
    sys.exit(1)
print("fixed: both modes generate")
