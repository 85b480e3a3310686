"""Gemma 4 assistant + do_sample=True is not lossless in transformers 5.24 (standalone: torch + transformers).

``SinglePositionMultiTokenCandidateGenerator.get_candidates`` drafts ``argmax`` of the assistant's
logits whatever ``do_sample`` says and returns the *raw* logits as q; ``_speculative_sampling``
then accepts the argmax draft x with probability min(1, p(x)/q(x)) >= p(x), as if x had been
sampled from softmax(raw logits).  The emitted law of the first verified token is then

    P(x) = min(1, p(x)/q(x)),   P(y != x) = (1 - min(1, p(x)/q(x))) * (p(y) - q(y))+ / sum (p - q)+

instead of p.  Smallest configuration: a 2-layer V=32 Gemma4ForCausalLM and a 2-layer
Gemma4AssistantForCausalLM built from configs with seeded weights, K = 1 (num_assistant_tokens),
temperature 1, no top-k / top-p, prompt [3, 5, 7, 9, 3], 3 new tokens.  The first new token is
sampled by the target alone (the generator drafts nothing on the prefill round); the second is the
first one verified.  The script draws N samples (one ``generate`` call each, global RNG seeded per
call), conditions on the most frequent first token t1, and compares the second token's counts with
the target's exact law p(. | prompt, t1) and with the law the code implements (above).

Prints both chi-square tests; exits 1 while the output follows the implemented law and not p
(p-value vs target < 1e-6), 0 otherwise.  Runtime about a minute on one CPU thread.

Run, from any directory (exits 1 on transformers 5.24.0 and 5.25.0):
    pip install torch==2.13.0 transformers==5.24.0
    python repro_gemma4_assistant_sampling.py

Expected output (transformers 5.24.0, x86-64 CPU; exit status 1):
    transformers 5.24.0, torch 2.13.0+cpu
    prompt [3, 5, 7, 9, 3], first token t1 = 13 in 795 of 1500 samples; draft x = argmax q = 14
      target p(x | prompt, t1) = 0.0001, raw-logit q(x) = 0.6577
      observed share of x as token 2: 0.0000 (target 0.0001, implemented rule 0.0002)
      chi-square vs the target's law:     stat 47.3, p = 1.67e-08
      chi-square vs the implemented rule: stat 4.2, p = 0.523
    BUG: the second token does not follow the target's law (exit 1)
"""

import sys

import torch
import transformers
from scipy.stats import chisquare
from transformers import Gemma4AssistantConfig, Gemma4AssistantForCausalLM, Gemma4ForCausalLM, Gemma4TextConfig

torch.set_num_threads(1)
V, N = 32, 1500
PROMPT = torch.tensor([[3, 5, 7, 9, 3]])


def text_config(seed_hidden=64):
    return Gemma4TextConfig(
        vocab_size=V, hidden_size=seed_hidden, intermediate_size=2 * seed_hidden, num_hidden_layers=2,
        num_attention_heads=seed_hidden // 32, num_key_value_heads=1, head_dim=32, max_position_embeddings=256,
        sliding_window=64, layer_types=["sliding_attention", "full_attention"], tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=None, pad_token_id=None, vocab_size_per_layer_input=0,
        hidden_size_per_layer_input=0,
    )  # fmt: skip


with torch.random.fork_rng():
    torch.manual_seed(0)
    target = Gemma4ForCausalLM(text_config()).eval()
    torch.manual_seed(1)
    assistant = Gemma4AssistantForCausalLM(
        Gemma4AssistantConfig(text_config=text_config(), backbone_hidden_size=64)
    ).eval()
with torch.no_grad():  # peaked laws, as the audit's fixtures
    target.lm_head.weight.mul_(15.0)
    assistant.lm_head.weight.mul_(15.0)
assistant.generation_config.num_assistant_tokens = 1
assistant.generation_config.num_assistant_tokens_schedule = "constant"
assistant.generation_config.assistant_confidence_threshold = 0.0

samples = []
with torch.no_grad():
    for i in range(N):
        torch.manual_seed(1000 + i)
        out = target.generate(PROMPT, attention_mask=torch.ones_like(PROMPT), assistant_model=assistant,
                              do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=3, pad_token_id=0)  # fmt: skip
        samples.append(out[0, PROMPT.shape[1] :].tolist())
samples = torch.tensor(samples)  # (N, 3)
t1 = int(samples[:, 0].mode().values)
second = samples[samples[:, 0] == t1, 1]
n = second.numel()

with torch.no_grad():
    prefix = torch.cat([PROMPT, torch.tensor([[t1]])], dim=1)
    p = torch.softmax(target(prefix).logits[0, -1].double(), -1)  # the target's exact law of token 2
    # what the assistant sees for its draft of token 2, as the generator builds it after the prefill round:
    # the embedding of t1 next to the target's last hidden state *of the prompt* and the prompt's shared KV states
    hidden = target(PROMPT, output_hidden_states=True, return_shared_kv_states=True)
    embeds = target.get_input_embeddings()(prefix[:, -1:])
    draft = assistant(
        inputs_embeds=torch.cat([embeds, hidden.hidden_states[-1][:, -1:]], dim=-1),
        attention_mask=torch.ones_like(prefix),
        position_ids=torch.tensor([[prefix.shape[1] - 1]]),
        shared_kv_states=hidden.shared_kv_states,
    )
    q = torch.softmax(draft.logits[0, -1].double(), -1)
x = int(q.argmax())
accept = min(1.0, float(p[x] / q[x]))
residual = (p - q).clamp(min=0)
implemented = (1 - accept) * residual / residual.sum()
implemented[x] += accept

counts = torch.bincount(second, minlength=V).double()


def chi2(law):
    keep = law * n >= 5  # pool small cells
    obs = torch.cat([counts[keep], counts[~keep].sum().view(1)]).numpy()
    exp = torch.cat([law[keep] * n, (law[~keep].sum() * n).view(1)]).numpy()
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return chisquare(obs, exp * obs.sum() / exp.sum())


vs_target, vs_code = chi2(p), chi2(implemented)
print(f"transformers {transformers.__version__}, torch {torch.__version__}")
print(f"prompt {PROMPT[0].tolist()}, first token t1 = {t1} in {n} of {N} samples; draft x = argmax q = {x}")
print(f"  target p(x | prompt, t1) = {float(p[x]):.4f}, raw-logit q(x) = {float(q[x]):.4f}")
print(f"  observed share of x as token 2: {float(counts[x]) / n:.4f} (target {float(p[x]):.4f}, "
      f"implemented rule {float(implemented[x]):.4f})")  # fmt: skip
print(f"  chi-square vs the target's law:     stat {vs_target.statistic:.1f}, p = {vs_target.pvalue:.3g}")
print(f"  chi-square vs the implemented rule: stat {vs_code.statistic:.1f}, p = {vs_code.pvalue:.3g}")
if vs_target.pvalue < 1e-6:
    print("BUG: the second token does not follow the target's law (exit 1)")
    sys.exit(1)
print("fixed: the second token follows the target's law")
