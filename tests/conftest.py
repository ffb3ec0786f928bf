import pytest
import torch


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread while a module's tests run: on a shared 2-core machine a second OpenMP thread
    that waits for a busy core costs ~1 ms per op (30x slower here); results do not depend on it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
