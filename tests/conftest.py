"""Shared test configuration.

Every test runs with one torch intra-op thread: the suite's tensors are small, and on a
shared 2-core machine OpenMP barriers and spinning cost 5-10x the CPU of the work itself.
Library code never changes the thread setting; only the tests (and benchmarks) do.

Hypothesis runs the same examples on every run (``derandomize``, no example database), so a
suite that passed on one clone passes on the next: CI never meets an example nobody has seen.
Searching for new examples is a deliberate act: ``pytest --hypothesis-profile explore``.
"""

import pytest
import torch
from hypothesis import settings

settings.register_profile("specverify", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False, max_examples=200)
settings.load_profile("specverify")


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
