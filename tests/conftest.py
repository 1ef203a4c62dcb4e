"""Suite-wide guards."""

import pytest


@pytest.fixture(autouse=True)
def _torch_threads_restored():
    """`load_backend(threads=N)` sets torch's process-wide intra-op pool (as `--threads` must);
    a test that asks for 1 thread would otherwise leave every later transformers test on one core
    (the engine tests ran 1.8x slower behind the dtype tests)."""
    import torch

    before = torch.get_num_threads()
    yield
    if torch.get_num_threads() != before:
        torch.set_num_threads(before)
