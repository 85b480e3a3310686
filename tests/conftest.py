"""Shared test configuration.

Every test runs with one torch intra-op thread: the suite's tensors are small, and on a
shared 2-core machine OpenMP barriers and spinning cost 5-10x the CPU of the work itself.
Library code never changes the thread setting; only the tests (and benchmarks) do.
"""

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
