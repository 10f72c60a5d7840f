"""The shared image builder's recipe arithmetic: tags, cached tarball names, the debootstrap command.

The build itself (debootstrap + docker import) is exercised by the docker tests (tests/test_runtime_docker.py,
tests/test_gui_tasks.py), which build the images when their engine lacks them.
"""

from dataclasses import replace
from pathlib import Path

import pytest

from envs.runtime.guest_image import GUEST_PACKAGES, GUEST_WHEELS, GuestRecipe
from envs.runtime.images import SANDBOX_PACKAGES, ImageRecipe
from envs.runtime.rootfs_image import debootstrap_command, find_debootstrap


def test_recipes_keep_the_tags_and_tarballs_they_had_before_sharing_a_builder():
    # pinned: the images in engines and the tarballs in caches built before the shared builder stay valid (the guest's
    # changed with its contents: OSWorld's user, the offline apt repository, gsettings, Mahjongg, scrot, OSWorld's apps)
    assert ImageRecipe().tag == "nextstate/sandbox:bookworm-21f3a847fcd8"
    assert GuestRecipe().tag == "nextstate/desktop-guest:bookworm-0c81dd7d773b"
    cache = Path("/cache")
    assert ImageRecipe().tarball(cache) == cache / "rootfs-bookworm-21f3a847fcd8.tar"
    assert GuestRecipe().tarball(cache) == cache / "desktop-guest-bookworm-0c81dd7d773b.tar"


def test_recipes_contents():
    sandbox, guest = ImageRecipe(), GuestRecipe()
    assert sandbox.packages == SANDBOX_PACKAGES and sandbox.wheels == () and sandbox.dirs == ()
    assert sandbox.env == {"LANG": "C.UTF-8", "PATH": "/usr/local/bin:/usr/bin:/bin"}
    assert guest.packages == GUEST_PACKAGES and guest.wheels == GUEST_WHEELS
    assert guest.dirs == ("home/user/Desktop",)
    assert guest.offline_packages == ("zsh", "expect", "python3-lxml", "jq") and "gnome-mahjongg" in guest.packages
    assert {"libreoffice-calc", "gimp", "vlc", "thunderbird", "chromium"} <= set(guest.apt_packages)
    assert guest.env["PATH"] == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def test_key_follows_the_contents():
    base = ImageRecipe()
    assert ImageRecipe().key == base.key  # deterministic
    changed = [
        replace(base, packages=base.packages + ("curl",)),
        replace(base, suite="trixie"),
        replace(base, mirror="http://mirror.example/debian"),
        replace(base, variant="buildd"),
        replace(base, env={**base.env, "X": "1"}),
        replace(base, wheels=("pyrect==0.2.0",)),
        replace(GuestRecipe(), python_site="usr/lib/python3/dist-packages"),
        replace(base, offline_packages=("zsh",)),
        replace(base, revision="2"),
        replace(base, apt_packages=("vlc",)),
        replace(base, apt_sources=("deb [trusted=yes] http://127.0.0.1:9/repo stable main",)),
    ]
    keys = {r.key for r in changed}
    assert base.key not in keys and GuestRecipe().key not in keys and len(keys) == len(changed)
    # order of packages does not matter
    assert replace(base, packages=tuple(reversed(base.packages))).key == base.key


def test_debootstrap_command():
    cmd = debootstrap_command(GuestRecipe(), Path("/tmp/r"), Path("/c/debs"))
    assert Path(cmd[0]).name == "debootstrap"
    assert cmd[1:] == [
        "--variant=minbase",
        f"--include={','.join(GUEST_PACKAGES)}",
        "--cache-dir=/c/debs",
        "bookworm",
        "/tmp/r",
        "http://deb.debian.org/debian",
    ]


def test_debootstrap_is_found_outside_path(monkeypatch):
    """A root shell whose PATH lacks /usr/sbin (su, some containers) still finds it, as the builder and the tests'
    skip checks do."""
    if not Path("/usr/sbin/debootstrap").exists():
        pytest.skip("debootstrap is not installed (apt-get install debootstrap)")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert find_debootstrap() == "/usr/sbin/debootstrap"
