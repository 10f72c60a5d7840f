"""The parts of a task image build that need no root (`envs.terminal.build_sandbox`, `envs.runtime.egress_proxy`,
`envs.terminal.python_bases`): which destinations the build's proxy refuses and how it forwards the rest (served
in-process on loopback), the host's check of the built image's tar stream, and the Python an image gets. The builds
themselves, hostile ones included, are in tests/test_task_build_isolation.py."""

from __future__ import annotations

import asyncio
import io
import os
import socket
import tarfile
import threading
from pathlib import Path

import pytest

from envs.runtime import egress_proxy, pyenv
from envs.runtime.egress_proxy import refusal
from envs.terminal.build_sandbox import copy_image_tar
from envs.terminal.python_bases import Interpreter, asked_python, available_pythons, choose_python, install_python


# ----- the proxy -----
def test_refused_destinations():
    import psutil

    assert [refusal(a) for a in ("127.0.0.1", "127.9.9.9", "::1", "::ffff:127.0.0.1", "169.254.169.254", "fe80::1",
                                 "0.0.0.0", "::", "224.0.0.1", "ff02::1", "240.0.0.1")] == [
        "loopback", "loopback", "loopback", "loopback", "link-local", "link-local", "unspecified", "unspecified",
        "multicast", "multicast", "reserved"]
    own = [a.address.split("%")[0] for addrs in psutil.net_if_addrs().values() for a in addrs
           if a.family in (socket.AF_INET, socket.AF_INET6)]
    for address in own:  # every interface's address, loopback or not
        assert refusal(address) is not None, address
    assert refusal("93.184.215.14") is None and refusal("2606:2800:21f:cb07:6820:80da:af6b:8b2c") is None


class Origin:
    """A loopback HTTP server that answers every request with the request's own head."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            head = b""
            while b"\r\n\r\n" not in head:
                head += conn.recv(4096)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(head) + head)
            conn.close()


@pytest.fixture
def proxy(monkeypatch):
    """The proxy served in this process on a loopback port; `allowed` addresses pass its check (loopback is refused
    in a build, so the forwarding is tested against a loopback origin let through here)."""
    allowed: set[str] = set()
    real = egress_proxy.refusal
    monkeypatch.setattr(egress_proxy, "refusal", lambda a: None if a in allowed else real(a))
    listener = socket.create_server(("127.0.0.1", 0))
    stop_r, stop_w = os.pipe()
    thread = threading.Thread(target=lambda: asyncio.run(egress_proxy.serve(listener, stop_r)), daemon=True)
    thread.start()
    yield listener.getsockname()[1], allowed
    os.close(stop_w)
    thread.join(timeout=10)
    os.close(stop_r)


def ask(port: int, request: bytes, then: bytes = b"") -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        if then:
            assert s.recv(4096).startswith(b"HTTP/1.1 200 Connection established")
            s.sendall(then)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def test_the_proxy_forwards_connect_and_plain_http(proxy):
    port, allowed = proxy
    origin = Origin()
    allowed.add("127.0.0.1")
    tunneled = ask(port, f"CONNECT 127.0.0.1:{origin.port} HTTP/1.1\r\n\r\n".encode(),
                   then=b"GET /through HTTP/1.1\r\nHost: x\r\n\r\n")
    assert tunneled.startswith(b"HTTP/1.1 200 OK") and b"GET /through HTTP/1.1" in tunneled
    plain = ask(port, f"GET http://127.0.0.1:{origin.port}/dists/x?y=1 HTTP/1.1\r\nHost: h\r\n"
                      "Proxy-Connection: keep-alive\r\nProxy-Authorization: Basic eA==\r\n\r\n".encode())
    head = plain.split(b"\r\n\r\n", 1)[1]  # what the origin received: origin-form, hop-by-hop headers gone
    assert head.startswith(b"GET /dists/x?y=1 HTTP/1.1\r\n") and b"Connection: close" in head
    assert b"Proxy-" not in head and b"Host: h" in head


def test_the_proxy_refuses_in_a_403_and_a_line(proxy, capfd):
    port, _ = proxy
    origin = Origin()
    for request in (f"CONNECT 127.0.0.1:{origin.port} HTTP/1.1\r\n\r\n",
                    f"CONNECT localhost:{origin.port} HTTP/1.1\r\n\r\n",
                    f"GET http://127.0.0.1:{origin.port}/ HTTP/1.1\r\n\r\n", "GET /origin-form HTTP/1.1\r\n\r\n",
                    "GET https://example.com/ HTTP/1.1\r\n\r\n", "CONNECT example.com HTTP/1.1\r\n\r\n"):
        answer = ask(port, request.encode())
        assert answer.startswith(b"HTTP/1.1 403 Forbidden"), (request, answer)
    err = capfd.readouterr().err
    assert f"refused CONNECT 127.0.0.1:{origin.port} HTTP/1.1: 127.0.0.1 is loopback" in err
    assert "localhost is 127.0.0.1, loopback" in err and "only CONNECT and http:// requests" in err
    assert "CONNECT needs host:port" in err


# ----- the built image's tar, checked on the host -----
def tar_of(*members: tuple[tarfile.TarInfo, bytes | None]) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for info, data in members:
            info.size = len(data or b"")
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    buf.seek(0)
    return buf


def member(name: str, kind: bytes = tarfile.REGTYPE, **fields) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
    for k, v in fields.items():
        setattr(info, k, v)
    return info


def test_a_real_roots_tar_is_copied_as_it_is(tmp_path):
    out = tmp_path / "image.tar"
    copy_image_tar(tar_of((member("./", tarfile.DIRTYPE), None), (member("./proc", tarfile.DIRTYPE, uid=65534,
                                                                         mode=0o555), None),
                          (member("./usr", tarfile.DIRTYPE), None),
                          (member("./usr/bin/sudo", mode=0o4755, uid=0), b"#!x"),
                          (member("./usr/bin/sudoedit", tarfile.LNKTYPE, linkname="./usr/bin/sudo"), None),
                          (member("./app", tarfile.SYMTYPE, linkname="/etc"), None),
                          (member("./home/u/f", uid=1000, gid=1000, uname="u"), b"data")), out, 1 << 20)
    with tarfile.open(out) as tar:
        got = {m.name: m for m in tar.getmembers()}
        assert tar.extractfile("./home/u/f").read() == b"data"
    assert list(got) == [".", "./proc", "./usr", "./usr/bin/sudo", "./usr/bin/sudoedit", "./app", "./home/u/f"]
    assert got["./usr/bin/sudo"].mode == 0o4755 and got["./home/u/f"].uid == 1000 and got["./home/u/f"].uname == ""
    assert (got["./proc"].uid, got["./proc"].mode) == (0, 0o755)  # the sandbox's /proc seen there: a plain dir
    assert got["./app"].linkname == "/etc" and got["./usr/bin/sudoedit"].linkname == "./usr/bin/sudo"


@pytest.mark.parametrize("members, says", [
    ([(member("../etc/cron.d/x"), b"x")], "climbs out of the root"),
    ([(member("./a/../../x"), b"x")], "climbs out of the root"),
    ([(member("./lib", tarfile.SYMTYPE, linkname="/etc"), None), (member("./lib/passwd"), b"x")], "below a symlink"),
    ([(member("./x"), b"1"), (member("./x"), b"2")], "twice"),
    ([(member("./dev/sda", tarfile.BLKTYPE, devmajor=8), None)], "device node"),
    ([(member("./mem", tarfile.CHRTYPE, devmajor=1, devminor=1), None)], "device node"),
    ([(member("./shadow", tarfile.LNKTYPE, linkname="/etc/shadow"), None)], "hard link"),
    ([(member("./x", uid=70000), b"x")], "owner outside the image"),
    ([(member("./big"), b"x" * 4096)], "more than"),
])
def test_what_no_real_root_holds_is_refused(tmp_path, members, says):
    with pytest.raises(ValueError, match=says):
        copy_image_tar(tar_of(*members), tmp_path / "image.tar", 4096)
    assert list(tmp_path.iterdir()) == []  # nothing half-written is left


# ----- the Python of a python:* image -----
@pytest.mark.parametrize("image, asked", [
    ("python:3.12-slim", "3.12"), ("python:3.12.4-bookworm", "3.12"), ("python:3.9", "3.9"),
    ("docker.io/library/python:3.13-slim@sha256:abc", "3.13"), ("public.ecr.aws/docker/library/python:3.10", "3.10"),
    ("ghcr.io/laude-institute/t-bench/python-3-13:20250620", "3.13"), ("python:3", "3"), ("python:3-slim", "3"),
    ("python:latest", "3"), ("python", "3"), ("python:slim-bookworm", "3"), ("python:2.7", "2.7"),
    ("ubuntu:24.04", None), ("pypy:3.10", None), ("ghcr.io/laude-institute/t-bench/ubuntu-24-04", None),
])
def test_the_version_an_image_asks_for(image, asked):
    assert asked_python(image) == asked


def fake_pyenv(root: Path, *versions: str) -> Path:
    for v in versions:
        (root / "versions" / v / "bin").mkdir(parents=True)
        (root / "versions" / v / "bin" / "python").write_text("#!/bin/sh\n")
    (root / "versions" / "system").mkdir(parents=True)  # not a version: ignored
    return root


def test_the_versions_this_machine_has_and_the_choice(tmp_path, monkeypatch):
    monkeypatch.setenv("PYENV_ROOT", str(fake_pyenv(tmp_path, "3.12.1", "3.12.10", "3.13.0", "2.7.18")))
    have = available_pythons()
    assert sorted(have) == ["2.7", "3.11", "3.12", "3.13"]
    assert have["3.12"].prefix.name == "3.12.10" and have["3.11"].prefix is None  # the newest patch; Debian's 3.11
    assert choose_python("3.12") == (have["3.12"], None) and choose_python("3")[0].version == "3.13"
    with pytest.raises(ValueError, match=r"asks for Python 3\.14, which this machine does not have \(it has 2\.7, "
                                         r"3\.11, 3\.12, 3\.13\); env\.python_fallback=nearest builds it with 3\.13"):
        choose_python("3.14")
    chosen, note = choose_python("3.14", "nearest")
    assert chosen.version == "3.13" and "built with 3.13" in note
    assert choose_python("3.6", "nearest")[0].version == "3.11"
    assert choose_python("2.6", "nearest")[0].version == "2.7"
    with pytest.raises(ValueError, match="none of Python 4"):
        choose_python("4.0", "nearest")
    with pytest.raises(ValueError, match="python_fallback='closest'"):
        choose_python("3.12", "closest")


def test_pyenv_is_found_without_home_from_the_running_python(tmp_path, monkeypatch):
    """A virtual environment made from a pyenv Python, run with an empty HOME (a fresh user, CI), still finds that
    pyenv's versions; PYENV_ROOT, when set, is the only root."""
    root = fake_pyenv(tmp_path / "pyenv", "3.12.1")
    monkeypatch.delenv("PYENV_ROOT", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "empty-home"))
    monkeypatch.setattr(pyenv.sys, "base_prefix", str(root / "versions" / "3.12.1"))
    assert pyenv.pyenv_roots()[0] == root and available_pythons()["3.12"].prefix == root / "versions" / "3.12.1"
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "other"))
    (tmp_path / "other" / "versions").mkdir(parents=True)
    assert pyenv.pyenv_roots() == [tmp_path / "other"]


@pytest.mark.skipif(os.geteuid() != 0, reason="ldconfig -r (the image's library cache) needs root")
def test_a_pyenv_build_is_laid_out_as_a_python_image_has_it(tmp_path):
    prefix = tmp_path / "pyenv" / "3.12.1"
    files = {
        "bin/python3.12": "\x7fELF binary\0", "bin/pip3.12": f"#!{prefix}/bin/python3.12\nimport pip\n",
        "lib/libpython3.12.so.1.0": "\x7fELF\0", "lib/libpython3.12.a": "static",
        "lib/python3.12/os.py": "", "lib/python3.12/test/test_os.py": "",
        "lib/python3.12/idlelib/idle_test/t.py": "", "lib/python3.12/_sysconfigdata__linux.py": f"P = '{prefix}'\n",
        "lib/python3.12/site-packages/pip/__init__.py": "", "lib/python3.12/site-packages/pip-23.2.1.dist-info/M": "",
        "lib/python3.12/site-packages/numpy/__init__.py": "",
        "lib/python3.12/site-packages/_sandboxing_egress_ca.pth": "",
        "include/python3.12/Python.h": "", "share/man/man1/python3.1": "",
    }
    for name, text in files.items():
        (prefix / name).parent.mkdir(parents=True, exist_ok=True)
        (prefix / name).write_text(text)
    for link, target in (("python3", "python3.12"), ("python", "python3.12"), ("pip", "pip3.12")):
        (prefix / "bin" / link).symlink_to(target)
    root = tmp_path / "root"
    (root / "usr" / "local" / "bin").mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "etc" / "ld.so.conf").write_text("/usr/local/lib\n")
    install_python(root, Interpreter("3.12", prefix))
    local = root / "usr" / "local"
    kept = {p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file() or p.is_symlink()}
    assert kept == {"bin/python3.12", "bin/pip3.12", "bin/python3", "bin/python", "bin/pip", "bin/pip3",
                    "lib/libpython3.12.so.1.0", "lib/python3.12/os.py", "lib/python3.12/_sysconfigdata__linux.py",
                    "lib/python3.12/site-packages/pip/__init__.py",
                    "lib/python3.12/site-packages/pip-23.2.1.dist-info/M", "include/python3.12/Python.h"}
    assert (local / "bin" / "pip3.12").read_text().startswith("#!/usr/local/bin/python3.12\n")
    assert str(prefix) not in (local / "lib" / "python3.12" / "_sysconfigdata__linux.py").read_text()
    assert os.readlink(local / "bin" / "python3") == "python3.12" and os.readlink(local / "bin" / "pip3") == "pip3.12"
    assert (root / "etc" / "ld.so.cache").exists()  # /usr/local/lib is searched for libpython
