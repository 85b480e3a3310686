"""Measuring lossy rules: how far from the target, what the speedup buys, and whether a rule keeps its declared law.

``chain`` (a chain verifier's total-variation distance per in-block and absolute position,
with intervals and conformance to a declared law), ``tree`` (the same for tree verifiers),
``decoder`` (for a whole decoder), ``sweep`` (one knob swept: the trade-off table),
``costmodel`` (the speedup and memory-bound latency model, used by the drafter audit too).
"""
