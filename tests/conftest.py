import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from fixture_envs import register_fixture_envs  # noqa: E402

register_fixture_envs()
