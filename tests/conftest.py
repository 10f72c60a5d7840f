import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from fixture_envs import register_fixture_envs  # noqa: E402

register_fixture_envs()


@pytest.fixture(scope="module")
def one_torch_thread():
    """Torch on one thread for a module's tests (`pytestmark = pytest.mark.usefixtures("one_torch_thread")`): a tiny
    model gains nothing from 2 threads, and on a busy shared CPU OpenMP spinning makes it ~30x slower."""
    import torch

    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)
