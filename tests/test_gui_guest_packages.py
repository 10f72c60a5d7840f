"""`env.guest_packages` / `env.guest_apt_sources`: packages added to the desktop's guest root.

Fast: the config -> recipe mapping and its key (no build), the one-line errors at config time, apt's reason for an
unreachable source (the host's apt-get against a loopback port nobody listens on). Slow (`-m slow`, root): a layer with
one tiny local .deb built over the guest root, its program run in a sandbox desktop, the guest's own root untouched;
and a layer whose apt source cannot be reached failing in one line.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from envs.gui.env import GUIConfig, GUIEnv, make_desktop
from envs.runtime.guest_image import GuestRecipe, guest_recipe
from envs.runtime.rootfs_image import LayerRecipe, PackageInstallError, apt_failure_reason

VSCODE_SOURCE = "deb [trusted=yes] https://packages.microsoft.com/repos/code stable main"
PROGRAM = "nextstate-hello"


def tiny_deb(where: Path, text: str = "hello from a guest package") -> Path:
    """A one-script package (/usr/bin/nextstate-hello), byte-for-byte reproducible: fixed modes, mtimes and
    SOURCE_DATE_EPOCH, so the layer's key (which hashes the file) is the same in every run and its build is reused."""
    if shutil.which("dpkg-deb") is None:
        pytest.skip("dpkg-deb is not installed (it comes with dpkg on Debian)")
    pkg = where / "pkg"
    (pkg / "DEBIAN").mkdir(parents=True)
    (pkg / "usr" / "bin").mkdir(parents=True)
    (pkg / "DEBIAN" / "control").write_text(
        f"Package: {PROGRAM}\nVersion: 1.0\nArchitecture: all\nMaintainer: NextState tests <tests@nextstate.invalid>\n"
        "Description: a script in /usr/bin for the guest-package test\n")
    script = pkg / "usr" / "bin" / PROGRAM
    script.write_text(f"#!/bin/sh\necho '{text}'\n")
    for p in [pkg, *pkg.rglob("*")]:
        p.chmod(0o755 if p.is_dir() or p == script else 0o644)
        os.utime(p, (1_700_000_000, 1_700_000_000))
    out = where / f"{PROGRAM}_1.0_all.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(pkg), str(out)], check=True, capture_output=True,
                   env={**os.environ, "SOURCE_DATE_EPOCH": "1700000000"})
    return out


# ----- config -> recipe (no build) -----
def test_no_guest_packages_is_the_guests_own_recipe():
    cfg = GUIConfig()
    assert cfg.guest_packages == () and cfg.guest_apt_sources == () and cfg.guest_recipe() is None
    assert guest_recipe() == GuestRecipe()  # the default root: same key, same cached tree


def test_names_and_sources_make_a_layer_over_the_guest():
    cfg = GUIConfig(guest_packages=["code"], guest_apt_sources=[VSCODE_SOURCE])
    recipe = cfg.guest_recipe()
    assert isinstance(recipe, LayerRecipe) and recipe.base == GuestRecipe()
    assert recipe.apt_packages == ("code",) and recipe.local_debs == () and recipe.apt_sources == (VSCODE_SOURCE,)
    base = GuestRecipe()
    # its own key, tarball, image tag and sandbox root; the guest's are not touched
    assert recipe.key != base.key and recipe.tag != base.tag
    assert recipe.tarball(Path("/c")) == Path(f"/c/desktop-guest-plus-bookworm-{recipe.key}.tar")
    assert recipe.repository == base.repository and recipe.env == base.env and recipe.suite == base.suite
    # a string from the command line (env.guest_packages=code) is a list of one
    assert GUIConfig(guest_packages="code", guest_apt_sources=VSCODE_SOURCE).guest_recipe() == recipe


def test_the_key_follows_the_additions(tmp_path):
    deb = tiny_deb(tmp_path)
    one = guest_recipe([str(deb)])
    assert one.local_debs == (str(deb),) and one.apt_packages == ()
    assert one.key == guest_recipe([str(deb)]).key  # deterministic
    assert guest_recipe(["code", "vim"]).key == guest_recipe(["vim", "code"]).key  # order does not matter
    other_dir = tmp_path / "other"
    other_dir.mkdir()
    changed = tiny_deb(other_dir, text="another text")  # same name, other content
    keys = {
        one.key,
        guest_recipe([str(changed)]).key,
        guest_recipe(["code"]).key,
        guest_recipe(["code"], [VSCODE_SOURCE]).key,
        guest_recipe(["code", str(deb)]).key,
        replace(guest_recipe(["code"]), base=replace(GuestRecipe(), revision="other")).key,  # the base's key counts
        GuestRecipe().key,
    }
    assert len(keys) == 7
    # the content counts, not where the file is
    copy = tmp_path / "copy.deb"
    shutil.copyfile(deb, copy)
    assert guest_recipe([str(copy)]).key == one.key


def test_relative_deb_paths_become_absolute(tmp_path, monkeypatch):
    deb = tiny_deb(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert GUIConfig(guest_packages=[deb.name]).guest_recipe().local_debs == (str(deb),)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"guest_packages": ["/nonexistent/code_1.2_amd64.deb"]},
         "gui guest package /nonexistent/code_1.2_amd64.deb: no such file"),
        ({"guest_packages": ["Code"]}, "gui guest package 'Code' is neither a Debian package name nor a path"),
        ({"guest_packages": ["code"], "guest_apt_sources": ["https://packages.microsoft.com/repos/code stable"]},
         "gui guest apt source 'https://packages.microsoft.com/repos/code stable' is not an apt line"),
        ({"guest_apt_sources": [VSCODE_SOURCE]}, "gui guest_apt_sources without guest_packages"),
        ({"guest_packages": ["code", "code"]}, "gui guest package listed twice: code"),
        ({"guest_packages": ["code"], "backend": "osworld", "osworld_url": "http://vm:5000"},
         "gui guest_packages cannot be used with backend=osworld"),
        ({"guest_packages": ["code"], "isolation": "none"}, "gui guest_packages cannot be used with isolation=none"),
        ({"guest_packages": ["code"], "backend": "docker", "docker_image": "mine:1"},
         "gui guest_packages cannot be used with docker_image"),
    ],
)
def test_bad_input_is_refused_at_config_time_in_one_line(options, message):
    with pytest.raises(ValueError) as err:
        GUIConfig(**options)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)
    with pytest.raises(ValueError, match=message.split(":")[0]):
        GUIEnv(**options)  # the env's constructor (a launch, its dry run) refuses it the same way


def test_a_file_that_is_not_a_deb_is_refused(tmp_path):
    fake = tmp_path / "code.deb"
    fake.write_text("not an ar archive")
    with pytest.raises(ValueError, match=f"gui guest package {fake}: not a Debian package"):
        GUIConfig(guest_packages=[str(fake)])


def test_the_recipe_reaches_the_local_sandbox_and_the_docker_guest(monkeypatch):
    """make_desktop hands the recipe to the backend that builds the root (the backends are replaced: no desktop)."""
    import envs.runtime.desktop as desktop
    import envs.runtime.osworld_docker as osworld_docker

    seen = {}
    monkeypatch.setattr(desktop, "LocalDesktop", lambda cfg: seen.setdefault("local", cfg))
    monkeypatch.setattr(osworld_docker, "DockerGuest", lambda cfg: seen.setdefault("docker", cfg))
    make_desktop(GUIConfig(guest_packages=["code"], guest_apt_sources=[VSCODE_SOURCE]))
    make_desktop(GUIConfig(backend="docker", guest_packages=["code"], guest_apt_sources=[VSCODE_SOURCE]))
    expected = guest_recipe(["code"], [VSCODE_SOURCE])
    assert seen["local"].root_recipe == expected and seen["docker"].recipe == expected
    seen.clear()
    make_desktop(GUIConfig())
    assert seen["local"].root_recipe is None  # the guest's own root


# ----- apt's reason in one line -----
def test_an_unreachable_source_is_named_with_apts_reason(tmp_path):
    """The host's apt-get (private lists and cache: the host's own are not touched) against a loopback port that
    refuses, with --error-on=any as the build runs it."""
    if shutil.which("apt-get") is None:
        pytest.skip("apt-get is not installed (not a Debian-like host)")
    with socket.socket() as s:  # a port nobody listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        (tmp_path / "sources.list").write_text(f"deb [trusted=yes] http://127.0.0.1:{port}/repo stable main\n")
        (tmp_path / "parts").mkdir()
        (tmp_path / "lists" / "partial").mkdir(parents=True)
        proc = subprocess.run(
            ["apt-get", f"-o=Dir::Etc::sourcelist={tmp_path}/sources.list", f"-o=Dir::Etc::sourceparts={tmp_path}/parts",
             f"-o=Dir::State::Lists={tmp_path}/lists", f"-o=Dir::Cache={tmp_path}/cache", "update", "-q",
             "--error-on=any"], capture_output=True, text=True, env={**os.environ, "LANG": "C"})
    assert proc.returncode != 0
    reason = apt_failure_reason(proc.stdout + "\n" + proc.stderr)
    assert reason.startswith(f"cannot reach http://127.0.0.1:{port}/repo/dists/stable/InRelease: ") and "\n" not in reason
    assert "refused" in reason or "connect" in reason.lower()


def test_apts_other_failures_in_one_line():
    missing = "Reading package lists...\nBuilding dependency tree...\nE: Unable to locate package code\n"
    assert apt_failure_reason(missing) == "Unable to locate package code"
    broken = ("The following packages have unmet dependencies:\n nextstate-x : Depends: libnothere but it is not "
              "installable\nE: Unable to correct problems, you have held broken packages.\n")
    assert apt_failure_reason(broken) == ("nextstate-x : Depends: libnothere but it is not installable; "
                                          "Unable to correct problems, you have held broken packages.")
    assert apt_failure_reason("") == "apt-get failed without a message"


# ----- a real layer (slow: unpacks and packs the guest root, about 2 GB) -----
def _build_prerequisites() -> None:
    if os.geteuid() != 0:
        pytest.skip("building a guest root and the desktop sandbox need root")
    for tool in ("chroot", "tar", "Xvfb"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")


def _tree_digest(root: Path) -> str:
    """What the guest's own root holds where a package would change it: dpkg's status and /usr/bin's listing."""
    h = hashlib.sha256((root / "var/lib/dpkg/status").read_bytes())
    h.update("\n".join(sorted(os.listdir(root / "usr/bin"))).encode())
    return h.hexdigest()


@pytest.mark.slow
def test_a_local_deb_is_in_the_sandbox_desktop_and_the_guest_root_is_untouched(tmp_path):
    _build_prerequisites()
    from envs.runtime.sandbox_root import ensure_sandbox_root

    base_root = ensure_sandbox_root()  # the guest's own root (built once, shared)
    before = _tree_digest(base_root)
    deb = tiny_deb(tmp_path)
    env = GUIEnv(guest_packages=[str(deb)], max_steps=3)
    try:
        env.reset(options={"task": "ns-form-name-alice"})  # builds the layer's root the first time (minutes)
        lower = env.desktop.place.lower
        assert lower != base_root and (lower / "usr/bin" / PROGRAM).exists()
        r = env.desktop.execute([PROGRAM])
        assert (r.exit_code, r.stdout.strip()) == (0, "hello from a guest package")
        r = env.desktop.execute(["dpkg-query", "-W", "-f=${Status}", PROGRAM])
        assert r.stdout == "install ok installed"
        # the guest's apps are still there, and apt knows only the root's offline repository again
        assert (lower / "usr/bin/libreoffice").exists() and (lower / "srv/offline-apt/Packages").exists()
        assert not list((lower / "etc/apt/sources.list.d").glob("nextstate-build*"))
        assert not [p for p in (lower / "var/lib/apt/lists").iterdir() if "debian.org" in p.name]
    finally:
        env.close()
    assert not (base_root / "usr/bin" / PROGRAM).exists() and _tree_digest(base_root) == before
    plain = GUIEnv(max_steps=3)
    try:
        plain.reset(options={"task": "ns-form-name-alice"})
        assert plain.desktop.place.lower == base_root
        assert plain.desktop.execute(["sh", "-c", f"command -v {PROGRAM}"]).exit_code != 0
    finally:
        plain.close()


@pytest.mark.slow
def test_an_unreachable_source_fails_the_build_in_one_line(tmp_path):
    _build_prerequisites()
    from envs.runtime.rootfs_image import build_rootfs_tarball, default_cache_dir

    with socket.socket() as s:  # bound, never listening: connections are refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        layer = guest_recipe(["nextstate-nothere"], [f"deb [trusted=yes] http://127.0.0.1:{port}/repo stable main"])
        with pytest.raises(PackageInstallError) as err:
            build_rootfs_tarball(layer, default_cache_dir())
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("installing nextstate-nothere into the nextstate/desktop-guest rootfs")
    assert f"cannot reach http://127.0.0.1:{port}/repo/dists/stable/InRelease" in msg
    assert not layer.tarball(default_cache_dir()).exists()
    with pytest.raises(PackageInstallError, match="cannot reach"):  # not tried twice by one process
        build_rootfs_tarball(layer, default_cache_dir())


@pytest.mark.slow
def test_the_docker_guest_gets_the_package_too(tmp_path):
    """backend=docker: the layer's tarball imported as its own image tag, the program there in the container."""
    _build_prerequisites()
    import docker

    from tests.gui_support import docker_engine

    host = docker_engine()
    deb = tiny_deb(tmp_path)
    layer = guest_recipe([str(deb)])
    env = GUIEnv(backend="docker", docker_host=host, guest_packages=[str(deb)], max_steps=3)
    try:
        env.reset(options={"task": "ns-form-name-alice"})
        assert env.desktop.cfg.image == layer.tag != GuestRecipe().tag
        r = env.desktop.execute([PROGRAM])
        assert (r.exit_code, r.stdout.strip()) == (0, "hello from a guest package")
    finally:
        env.close()
        client = docker.DockerClient(base_url=host)
        try:
            client.images.remove(layer.tag, force=True)  # 2 GB in the engine: not kept for other tests
        finally:
            client.close()
