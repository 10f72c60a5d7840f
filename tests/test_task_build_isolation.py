"""A task directory's Dockerfile builds as isolated as under Docker's builder (`envs.terminal.build_sandbox`): each
hostile Dockerfile below is a clear BuildError and leaves the host as it was. Real builds (root, the base rootfs, a
loop device): the hostile steps write host paths, reach servers on the host's loopback and on its own address, make
device nodes, leave a chroot, fill the disk past `storage_mb`, and put host programs on PATH; the build's own sandbox
shows a shifted uid, a minimal /dev and no process of one step in the next. The positive side: a RUN step installs
from PyPI and from Debian's mirror through the build's proxy (`network`: skipped, saying so, where neither registry
can be reached)."""

from __future__ import annotations

import os
import shutil
import socket
import tarfile
import threading
import uuid
from pathlib import Path

import pytest

from envs.terminal.build_sandbox import BUILD_UID_BASE
from envs.terminal.task_dirs import read_task_dir
from envs.terminal.task_image import BuildError, build_task_environment, ensure_base, environment_key, task_cache_dir

pytestmark = pytest.mark.integration
BUNDLED = Path(__file__).resolve().parents[1] / "envs" / "terminal" / "task_dirs"
TASK_TOML = """[agent]\ntimeout_sec = 60.0\n[verifier]\ntimeout_sec = 60.0\n[environment]\nbuild_timeout_sec = 300.0
storage_mb = {storage_mb}\n"""


@pytest.fixture(scope="module", autouse=True)
def builder_or_skip():
    if os.geteuid() != 0:
        pytest.skip("a task image build maps a uid range and mounts a loop device: it needs root")
    for tool in ("nsenter", "prlimit", "debootstrap", "mkfs.ext4"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed on this machine")
    if not os.path.exists("/dev/loop-control"):
        pytest.skip("this machine has no loop devices (/dev/loop-control): a build's disk cannot be capped")


def task_with(tmp_path: Path, dockerfile: str, *, storage_mb: int = 1024, files: dict[str, str] | None = None) -> dict:
    """A Harbor task directory (the bundled count-log-levels, its environment replaced) and its task dict."""
    d = tmp_path / f"t-{uuid.uuid4().hex[:8]}"
    shutil.copytree(BUNDLED / "harbor" / "count-log-levels", d)
    (d / "task.toml").write_text(TASK_TOML.format(storage_mb=storage_mb))
    (d / "environment" / "Dockerfile").write_text(dockerfile)
    for name, text in (files or {}).items():
        (d / "environment" / name).write_text(text)
    return read_task_dir(d, "harbor")


def hostile(tmp_path: Path, dockerfile: str, **kwargs) -> str:
    """Build it; the BuildError's message (the test fails if it builds)."""
    with pytest.raises(BuildError) as err:
        build_task_environment(task_with(tmp_path, dockerfile, **kwargs))
    return str(err.value)


def image_file(built, name: str) -> str:
    with tarfile.open(built.tarball) as tar:
        return tar.extractfile(f"./{name}").read().decode()


@pytest.fixture
def host_only_dir(tmp_path):
    """A directory that exists on the host and in no image (so a write that lands there came out of the sandbox)."""
    d = tmp_path / f"host-only-{uuid.uuid4().hex[:8]}"
    d.mkdir()
    return d


# ----- writes to host paths -----
def test_a_step_cannot_write_host_paths(tmp_path, host_only_dir):
    home = Path.home() / f".nextstate-build-test-{uuid.uuid4().hex[:8]}"  # /root/...: a host-only folder there too
    home.mkdir()
    try:
        task = task_with(tmp_path, "FROM debian:bookworm\nCOPY probe.py /probe.py\nRUN python3 /probe.py\n")
        targets = [host_only_dir, home, Path(task["context"])]  # the build context too: no step may write there
        (targets[2] / "probe.py").write_text(PROBE_WRITE.format(dirs=[str(t) for t in targets]))
        before = {p: sorted(p.iterdir()) for p in targets}
        with pytest.raises(BuildError, match=r"line 3 \(RUN\) failed \(exit 1\)") as err:
            build_task_environment(task)
        assert "wrote nothing outside" in str(err.value)
        assert {p: sorted(p.iterdir()) for p in targets} == before  # the host is unchanged
    finally:
        shutil.rmtree(home, ignore_errors=True)


PROBE_WRITE = """import os, sys
wrote = []
for d in {dirs!r}:
    for path in (d, "/proc/1/root" + d, "/proc/self/root" + d, "/proc/1/cwd" + d):
        try:
            with open(os.path.join(path, "pwned"), "w") as f:
                f.write("escaped")
            wrote.append(path)
        except OSError as exc:
            print(path, exc)
print("wrote", wrote) if wrote else print("wrote nothing outside")
sys.exit(0 if wrote else 1)
"""


def test_the_classic_chroot_escape_leads_nowhere(tmp_path, host_only_dir):
    probe = f"""import os, sys
os.makedirs("/jail", exist_ok=True)
outside = os.open("/", os.O_RDONLY)
os.chroot("/jail")          # root may leave a chroot it is in: chroot deeper, then climb from the old root
os.fchdir(outside)
for _ in range(256):
    os.chdir("..")
os.chroot(".")
print("now at", os.listdir("/")[:8])
open({str(host_only_dir / "escaped")!r}, "w").write("out")
"""
    message = hostile(tmp_path, "FROM debian:bookworm\nCOPY probe.py /probe.py\nRUN python3 /probe.py\n",
                      files={"probe.py": probe})
    assert "No such file or directory" in message and "escaped" in message
    assert list(host_only_dir.iterdir()) == []


# ----- devices -----
def test_mknod_is_refused_and_dev_is_minimal(tmp_path):
    message = hostile(tmp_path, "FROM debian:bookworm\nRUN mknod /tmp/disk b 8 0 || mknod /tmp/mem c 1 1\n")
    assert "Operation not permitted" in message
    built = build_task_environment(task_with(
        tmp_path, "FROM debian:bookworm\nRUN ls -A /dev > /dev-list && cat /proc/self/uid_map > /uid-map && "
                  "id -u > /uid\n"))
    devices = set(image_file(built, "dev-list").split())
    assert devices <= {"null", "zero", "full", "random", "urandom", "tty", "pts", "ptmx", "shm", "fd", "stdin",
                       "stdout", "stderr"}, devices  # no host device (no disk, loop, kmsg, mem)
    assert image_file(built, "uid-map").split() == ["0", str(BUILD_UID_BASE), "65536"]  # root inside, not outside
    assert image_file(built, "uid").strip() == "0"
    with tarfile.open(built.tarball) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert not [m for m in members.values() if m.ischr() or m.isblk()]
    assert members["./dev"].isdir() and not [n for n in members if n.startswith("./dev/")]


# ----- the network -----
class Listener:
    """A TCP server on the host at `address` that counts who connects."""

    def __init__(self, address: str):
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.bind((address, 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 7\r\n\r\nsecret\n")
            conn.close()

    def close(self) -> None:
        self.sock.close()


PROBE_CONNECT = """import os, socket, sys
host, port = sys.argv[1], int(sys.argv[2])
proxy = ("127.0.0.1", int(os.environ["http_proxy"].rsplit(":", 1)[1]))
reached = []
def attempt(what, address, payload):
    try:
        with socket.create_connection(address, timeout=5) as s:
            if payload:
                s.sendall(payload)
            answer = s.recv(200)
            print(what, answer[:60])
            if b"secret" in answer or b" 200 " in answer.split(b"\\r\\n")[0] + b" ":
                reached.append(what)
    except OSError as exc:
        print(what, exc)
attempt("direct", (host, port), b"GET / HTTP/1.0\\r\\n\\r\\n")
for name in (host, "localhost", socket.gethostname()):
    attempt("CONNECT " + name, proxy, f"CONNECT {name}:{port} HTTP/1.1\\r\\nHost: {name}\\r\\n\\r\\n".encode())
    attempt("GET " + name, proxy, f"GET http://{name}:{port}/ HTTP/1.1\\r\\nHost: {name}\\r\\n\\r\\n".encode())
print("reached", reached)
sys.exit(0 if reached else 1)
"""


def _probe_server(tmp_path: Path, address: str) -> tuple[str, int]:
    server = Listener(address)
    try:
        message = hostile(tmp_path, f"FROM debian:bookworm\nCOPY probe.py /probe.py\n"
                                    f"RUN python3 /probe.py {address} {server.port}\n",
                          files={"probe.py": PROBE_CONNECT})
        return message, server.connections
    finally:
        server.close()


def test_a_step_cannot_reach_the_hosts_loopback(tmp_path):
    message, connections = _probe_server(tmp_path, "127.0.0.1")
    assert connections == 0
    assert "reached []" in message and "(build proxy) refused CONNECT 127.0.0.1" in message and "loopback" in message


def host_address() -> str | None:
    import psutil

    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return a.address
    return None


def test_a_step_cannot_reach_the_hosts_own_address(tmp_path):
    address = host_address()
    if address is None:
        pytest.skip("this machine has no IPv4 address but loopback")
    message, connections = _probe_server(tmp_path, address)
    assert connections == 0
    assert "reached []" in message and "an address of this host" in message
    assert "Network is unreachable" in message  # and no route out of the step's namespace but the proxy


# ----- the disk -----
def test_writing_past_storage_mb_fails_and_leaves_nothing(tmp_path):
    task = task_with(tmp_path, "FROM debian:bookworm\nRUN dd if=/dev/zero of=/fill bs=1M count=200\n", storage_mb=64)
    with pytest.raises(BuildError, match="No space left on device"):
        build_task_environment(task)
    work = task_cache_dir() / ".building" / environment_key(task, ensure_base("debian", task_cache_dir()).name)
    assert not work.exists() and str(work) not in Path("/proc/self/mounts").read_text()  # disk unmounted, removed


def test_an_archive_that_climbs_out_is_refused_before_anything_lands(tmp_path):
    task = task_with(tmp_path, "FROM debian:bookworm\nADD bundle.tar /opt/\n")
    with tarfile.open(Path(task["context"]) / "bundle.tar", "w") as tar:
        for name in ("ok.txt", "../../etc/cron.d/pwned"):
            info = tarfile.TarInfo(name)
            tar.addfile(info, None)
    with pytest.raises(BuildError, match=r"bundle.tar holds a path outside its root \(../../etc/cron.d/pwned\)"):
        build_task_environment(read_task_dir(task["task_dir"], "harbor"))


# ----- what a step leaves, and the host programs the builder runs -----
def test_a_steps_processes_end_with_it(tmp_path):
    """A RUN's background process (holding its output open, even) ends with the RUN, as under Docker."""
    built = build_task_environment(task_with(
        tmp_path, "FROM debian:bookworm\nRUN (sleep 600 &) ; echo started\n"
                  "RUN ps -eo comm= > /seen && ! grep -qx sleep /seen\n"))
    assert "sleep" not in image_file(built, "seen").split() and "ps" in image_file(built, "seen").split()


def test_an_image_path_cannot_pick_the_host_programs_the_builder_runs(tmp_path, host_only_dir):
    marker = host_only_dir / "ran"
    for tool in ("prlimit", "nsenter", "cat", "tar", "mkdir", "env", "sh", "umount", "mount", "mkfs.ext4"):
        script = host_only_dir / tool
        script.write_text(f"#!/bin/sh\necho {tool} >> {marker}\nexit 1\n")
        script.chmod(0o755)
    built = build_task_environment(task_with(
        tmp_path, f"FROM debian:bookworm\nENV PATH={host_only_dir}:/usr/sbin:/usr/bin:/sbin:/bin\n"
                  "RUN useradd -m builder\n"
                  "USER builder\nWORKDIR /home/builder/app\nRUN touch made\n"))
    assert not marker.exists()
    assert built.env["PATH"].startswith(str(host_only_dir))  # the image's PATH as written, used inside only


# ----- the allowed way out -----
def registries_reachable() -> str | None:
    for host, port in (("pypi.org", 443), ("files.pythonhosted.org", 443), ("deb.debian.org", 80)):
        try:
            socket.create_connection((host, port), timeout=5).close()
        except OSError as exc:
            return f"{host}:{port} cannot be reached from this machine ({exc})"
    return None


@pytest.mark.network
def test_a_step_installs_from_pypi_and_debian_through_the_proxy(tmp_path):
    why = registries_reachable()
    if why:
        pytest.skip(why)
    built = build_task_environment(task_with(
        tmp_path, "FROM debian:bookworm\n"
                  "RUN pip install --break-system-packages --no-cache-dir six==1.17.0 && python3 -c 'import six'\n"
                  "RUN apt-get update && apt-get install -y --no-install-recommends jq && jq --version > /jq\n"))
    assert image_file(built, "jq").startswith("jq-")
    with tarfile.open(built.tarball) as tar:
        names = tar.getnames()
    assert any(n.endswith("/six.py") for n in names)
    assert not [n for n in names if "nextstate-build" in n]  # the build's CA bundle is not in the image


# ----- the Python of a python:* image -----
@pytest.mark.slow
def test_a_python_image_gets_the_version_it_asks_for(tmp_path):
    from envs.terminal.python_bases import available_pythons

    have = available_pythons().get("3.12")
    if have is None or have.prefix is None:
        pytest.skip("this machine has no Python 3.12 build (pyenv) to put in a python:3.12 image")
    built = build_task_environment(task_with(
        tmp_path, "FROM python:3.12-slim\nRUN python --version > /version && which python python3 pip > /which"
                  " && pip --version > /pip && python3 -c 'import ssl, sqlite3, ctypes, lzma, bz2, zlib, decimal'"
                  " && python -m venv /venv && /venv/bin/python -c 'import sys; assert sys.version_info[:2] == (3, 12)'"
                  "\n"))
    assert image_file(built, "version").startswith("Python 3.12.") and built.python == have.prefix.name
    assert image_file(built, "which").split() == ["/usr/local/bin/python", "/usr/local/bin/python3",
                                                  "/usr/local/bin/pip"]
    assert "(python 3.12)" in image_file(built, "pip") and built.env["PIP_BREAK_SYSTEM_PACKAGES"] == "1"
    with tarfile.open(built.tarball) as tar:
        names = tar.getnames()
    assert "./usr/local/lib/python3.12/os.py" in names
    assert not [n for n in names if "/python3.12/test/" in n or n.endswith("_sandboxing_egress_ca.pth")
                or n.endswith(".a")]  # no test suite, static library or this machine's own site-packages
