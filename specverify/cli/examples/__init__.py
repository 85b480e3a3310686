"""Example audits of real speculative-decoding implementations; their reports live under ``reports/``."""
