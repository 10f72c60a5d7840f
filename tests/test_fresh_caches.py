"""The suite never reads a cache left by an earlier run: conftest points every cache at this session's own folder."""

import os
from pathlib import Path

from conftest import TEST_CACHE
from hypothesis import settings

from envs.cache import cache_dir, cache_root


def test_every_cache_points_into_the_sessions_own_folder():
    assert cache_root() == TEST_CACHE / "nextstate" and cache_dir("warmstart") == TEST_CACHE / "nextstate" / "warmstart"
    for var in ("NEXTSTATE_CACHE", "HF_HOME", "XDG_CACHE_HOME", "MPLCONFIGDIR"):
        assert Path(os.environ[var]).is_relative_to(TEST_CACHE), var
    if not os.environ.get("NEXTSTATE_TEST_CACHE"):  # a fresh folder unless the developer named one
        assert TEST_CACHE.name.startswith("nextstate-test-cache-") and not TEST_CACHE.is_relative_to(Path.home())
    assert settings().database is None  # hypothesis replays no examples saved by an earlier run


def test_the_warm_start_cache_defaults_to_the_cache_root():
    import yaml

    local = yaml.safe_load((Path(__file__).parent.parent / "configs/policy/local.yaml").read_text())
    assert local["warm_start"]["cache_dir"] is None  # null: envs.cache's root, so NEXTSTATE_CACHE moves it too
