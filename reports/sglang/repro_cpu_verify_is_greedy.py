"""SGLang's speculative verification on CPU commits the target's argmax at every temperature.

Standalone (no specverify).  The function is pure Python, so any machine with SGLang shows it:

    pip install sglang==0.5.23      # on a CPU-only machine: the install line of reports/sglang/README.md
    python repro_cpu_verify_is_greedy.py

``sglang.srt.speculative.eagle_utils._verify_uses_greedy`` decides, per verify step, whether the step
commits ``argmax`` of the target's logits (greedy) or samples with the rejection rule.  For a batch of
sampled requests (``is_all_greedy=False``: temperature 1, say) it should answer False on every device
that samples; on CPU it answers True, with and without ``--speculative-use-rejection-sampling``, so a
sampled request served with EAGLE, EAGLE-3, MTP or NGRAM on CPU comes back greedy.  Exit 1 while it does.

Expected output with SGLang 0.5.23 (after its import warnings):

    device cuda rejection sampling False: greedy False
    device cuda rejection sampling True : greedy False
    device cpu  rejection sampling False: greedy True
    device cpu  rejection sampling True : greedy True
    FAULT: a sampled (non-greedy) batch is verified greedily on CPU
"""

import sys

from sglang.srt.speculative.eagle_utils import _verify_uses_greedy

greedy_on_cpu = False
for device in ("cuda", "cpu"):
    for rejection in (False, True):
        greedy = _verify_uses_greedy(is_all_greedy=False, is_cpu=device == "cpu", is_hip=False, is_xpu=False,
                                     use_rejection_sampling=rejection)  # fmt: skip
        print(f"device {device:<4} rejection sampling {rejection!s:<5}: greedy {greedy}")
        greedy_on_cpu |= greedy and device == "cpu"
if greedy_on_cpu:
    print("FAULT: a sampled (non-greedy) batch is verified greedily on CPU")
sys.exit(1 if greedy_on_cpu else 0)
