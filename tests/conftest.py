import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

# tests/data holds task directories whose own tests/ folders are the hidden tests of those tasks, not ours
collect_ignore_glob = ["data/*"]

# ----- no cache left by an earlier run reaches a test -----
# Every cache NextState (or a library it uses) keeps under HOME or /var/cache points into one fresh folder for this test
# session, removed at its end; NEXTSTATE_TEST_CACHE=<dir> reuses a folder of your choice instead (faster local reruns,
# never in CI). Kept: the docker / rootfs image builds (keyed by their recipe, see README "Caches").
# Under pytest-xdist the workers share the controller's folder (its path travels in _SESSION_VAR, which the workers
# inherit), so a warm start or a demonstration set built by one worker serves the others; only the controller removes it.
_KEEP = os.environ.get("NEXTSTATE_TEST_CACHE")
_SESSION_VAR = "_NEXTSTATE_TEST_SESSION_CACHE"
_WORKER = _SESSION_VAR in os.environ and "PYTEST_XDIST_WORKER" in os.environ
if _KEEP:
    TEST_CACHE = Path(_KEEP)
elif _WORKER:
    TEST_CACHE = Path(os.environ[_SESSION_VAR])
else:
    TEST_CACHE = Path(tempfile.mkdtemp(prefix="nextstate-test-cache-"))
    os.environ[_SESSION_VAR] = str(TEST_CACHE)
TEST_CACHE.mkdir(parents=True, exist_ok=True)
os.chmod(TEST_CACHE, 0o755)  # as root, the sandboxes' uids read SWE clones and venvs from here
os.environ.update({
    "NEXTSTATE_CACHE": str(TEST_CACHE / "nextstate"),  # warm starts, GUI demonstrations, SWE clones and venvs
    "HF_HOME": str(TEST_CACHE / "huggingface"),  # transformers / tokenizers / datasets downloads and modules
    "XDG_CACHE_HOME": str(TEST_CACHE / "xdg"),  # ~/.cache of everything else (pip, matplotlib, torch hub)
    "MPLCONFIGDIR": str(TEST_CACHE / "matplotlib"),
    "NEXTSTATE_TASK_ENV_CACHE": str(TEST_CACHE / "task-envs"),  # built Terminal-Bench / Harbor task environments
})

from hypothesis import settings  # noqa: E402
from hypothesis.configuration import set_hypothesis_home_dir  # noqa: E402

# hypothesis keeps failing examples (and a cache of constants) in ./.hypothesis and replays them next time: a cache too
set_hypothesis_home_dir(str(TEST_CACHE / "hypothesis"))
settings.register_profile("nextstate", database=None)
settings.load_profile("nextstate")

sys.path.insert(0, str(Path(__file__).parent))

from fixture_envs import register_fixture_envs  # noqa: E402

register_fixture_envs()


def pytest_unconfigure(config):
    if _WORKER:
        return
    from sandbox_support import stop_session_engine

    stop_session_engine()  # the docker engine the session's docker tests started, if any (every worker's)
    if not _KEEP:
        shutil.rmtree(TEST_CACHE, ignore_errors=True)


@pytest.fixture(scope="module")
def one_torch_thread():
    """Torch on one thread for a module's tests (`pytestmark = pytest.mark.usefixtures("one_torch_thread")`): a tiny
    model gains nothing from 2 threads, and on a busy shared CPU OpenMP spinning makes it ~30x slower."""
    import torch

    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)
