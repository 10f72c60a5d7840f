"""Starts a throwaway-root sandbox and then serves as its init. Run as a script by `envs.runtime.nsroot` (only the
standard library: it runs before anything else exists), as root.

    python -I -S nsroot_init.py < (one line of JSON config, then the pipe stays open: the sandbox lives as long as it)

Steps (why each is here rather than in bubblewrap: bubblewrap always sets no_new_privs, so `sudo` could never work in
it, and Debian's 0.8 cannot mount an overlay):
1. Stage the binds, still as the host's root, in a private mount namespace: each source is bind-mounted onto its
   placeholder under the scratch folder (`staged`; read-only ones remounted read-only). Made here, before the user
   namespace, a read-only bind is *locked*: no root inside can remount it writable (a bind made inside could be, and
   then written wherever its files belong to a mapped uid). Paths the sandbox uid could not traverse work too.
2. unshare user, mount, pid, network, IPC, UTS and cgroup namespaces. A helper child (still in the parent user
   namespace, and root: only root may map a range) maps uids and gids 0..count-1 of the new user namespace onto host
   uids `uid_base`.., so the sandbox's root is a non-root host uid and no host uid below `uid_base` exists inside.
3. Fork the namespace's pid 1, which mounts: a size-capped tmpfs holding the overlay's upper layer (so nothing written
   reaches the host's disk, and all of it vanishes with the namespace; or the owner's directory, `scratch_tmpfs`
   false), the overlay (lower = the root tree, under `layers` when given: read-only snapshots stacked on it, topmost
   first), a fresh /proc, a minimal /dev (null, zero, full, random, urandom, tty, a private devpts, /dev/shm), a tmpfs
   /tmp, the staged binds at their targets (each target made a real directory or file first: a symlink or anything
   else in the way is replaced, in this sandbox's overlay only, never followed), `empty_dirs` made so (real, empty
   directories of this sandbox's own upper layer), the loopback interface up; then pivot_root into the overlay and
   detaches the old root, so no host path is reachable.
4. pid 1 prints nothing itself; the launcher prints `READY <host pid of pid 1> <fd>`, `fd` being pid 1's descriptor of
   the upper layer's folder (the owner opens it through /proc to read the sandbox's writes; pid 1 closes its own when
   the owner sends a byte), and waits. pid 1 reaps orphans and exits when its stdin (a pipe from the owner) closes, or
   when the launcher dies (PDEATHSIG): the kernel then kills every process of the namespace.
"""

import ctypes
import fcntl  # imported here, as the host's root: inside, the interpreter's own files may be out of reach
import json
import os
import select
import shutil
import signal
import socket
import stat
import struct
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
ST_TO_MS = {1: MS_RDONLY, 2: MS_NOSUID, 4: MS_NODEV, 8: MS_NOEXEC, 1024: MS_NOATIME, 2048: MS_NODIRATIME}
MNT_DETACH = 2
PR_SET_PDEATHSIG = 1
SYS_PIVOT_ROOT = 155  # x86_64
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")

libc = ctypes.CDLL(None, use_errno=True)


def fail(what):
    err = ctypes.get_errno()
    raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(source, target, fstype, flags, data=None):
    enc = lambda s: None if s is None else s.encode()
    if libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)) != 0:
        fail(f"mount {fstype or source} on {target}")


def bind(source, target, readonly):
    mount(source, target, None, MS_BIND | MS_REC)
    if readonly:
        # a bind keeps the locked flags of its source (nosuid, nodev, ...); a remount must repeat them or fail
        kept = 0
        f_flag = os.statvfs(target).f_flag
        for st, ms in ST_TO_MS.items():
            if f_flag & st:
                kept |= ms
        mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | kept)


def write_maps(pid, cfg):
    base, count = cfg["uid_base"], cfg["uid_count"]
    for kind in ("uid", "gid"):
        with open(f"/proc/{pid}/{kind}_map", "w") as f:
            f.write(f"0 {base} {count}\n")


def stage_binds(cfg):
    """Step 1: as the host's root, in a mount namespace of our own, each bind source onto its placeholder (made by the
    owner: a directory or an empty file); read-only ones remounted read-only, so the user namespace inherits them locked."""
    if libc.unshare(CLONE_NEWNS) != 0:
        fail("unshare (staging)")
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    for b in cfg["binds"]:
        bind(b["source"], b["staged"], b.get("readonly", True))


def unshare_and_map(cfg):
    """unshare, have a helper (still in the parent user namespace) write our uid/gid maps, become root of the
    namespace."""
    to_helper_r, to_helper_w = os.pipe()
    to_me_r, to_me_w = os.pipe()
    me = os.getpid()
    helper = os.fork()
    if helper == 0:
        try:
            os.close(to_helper_w)
            os.close(to_me_r)
            if os.read(to_helper_r, 1) == b"u":
                write_maps(me, cfg)
                os.write(to_me_w, b"m")
        finally:
            os._exit(0)
    os.close(to_helper_r)
    os.close(to_me_w)
    flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP
    if libc.unshare(flags) != 0:
        fail("unshare")
    os.write(to_helper_w, b"u")
    ok = os.read(to_me_r, 1) == b"m"
    os.waitpid(helper, 0)
    if not ok:
        raise OSError("the uid/gid maps of the sandbox could not be written")
    os.setgroups([])
    os.setresgid(0, 0, 0)
    os.setresuid(0, 0, 0)


def make_dev(root):
    dev = root + "/dev"
    mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=755,size=1m")
    for name in DEVICES:
        path = f"{dev}/{name}"
        open(path, "w").close()
        mount(f"/dev/{name}", path, None, MS_BIND)
    os.mkdir(dev + "/pts")
    mount("devpts", dev + "/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=620")
    os.symlink("pts/ptmx", dev + "/ptmx")
    os.mkdir(dev + "/shm")
    mount("tmpfs", dev + "/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size=256m")
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{dev}/{name}")


def real_path(merged, target, is_dir):
    """merged + target as a real directory (or, `is_dir` false, a regular file) whose every parent is a real
    directory: walked one component at a time with lstat, never through a symlink (the tree may be an agent's: a link
    there could point anywhere on the host, which this mount namespace still sees). What is in the way is removed (a
    whiteout in this sandbox's upper layer; the tree below is untouched)."""
    path = merged
    parts = [p for p in target.split("/") if p]
    for i, name in enumerate(parts):
        path = f"{path}/{name}"
        want_dir = is_dir or i < len(parts) - 1
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            st = None
        if st is not None and (stat.S_ISDIR(st.st_mode) if want_dir else stat.S_ISREG(st.st_mode)):
            continue
        if st is not None:
            shutil.rmtree(path) if stat.S_ISDIR(st.st_mode) else os.unlink(path)
        if want_dir:
            os.mkdir(path, 0o755)
        else:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o644))
    return path


def build_root(cfg):
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    scratch, merged = cfg["scratch"], cfg["merged"]
    # the overlay's upper layer lives in a tmpfs of this mount namespace: capped, and gone with it (unless the owner
    # keeps it in a directory of its own, `scratch_tmpfs` false: capped and removed by that owner)
    if cfg.get("scratch_tmpfs", True):
        mount("tmpfs", scratch, "tmpfs", MS_NOSUID | MS_NODEV, f"mode=700,size={int(cfg['upper_bytes'])}")
    os.makedirs(scratch + "/upper", exist_ok=True)
    os.makedirs(scratch + "/work", exist_ok=True)
    upper_fd = os.open(scratch, os.O_PATH | os.O_DIRECTORY)  # the owner reads the sandbox's writes through it
    # by path, not by fd: overlayfs clones its layers, which it may only do from this mount namespace
    lowers = ":".join([*cfg.get("layers", []), cfg["lower"]])
    opts = f"lowerdir={lowers},upperdir={scratch}/upper,workdir={scratch}/work"
    if cfg.get("userxattr"):
        opts += ",userxattr"
    mount("overlay", merged, "overlay", 0, opts)
    mount("proc", merged + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    make_dev(merged)
    if cfg["tmp_bytes"]:  # 0: the tree's own /tmp (an image build keeps what a step leaves there, as docker does)
        mount("tmpfs", merged + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={int(cfg['tmp_bytes'])}")
    for b in cfg["binds"]:
        target = real_path(merged, b["target"], os.path.isdir(b["staged"]))
        mount(b["staged"], target, None, MS_BIND | MS_REC)  # keeps the staged mount's locked flags
    for target in cfg.get("empty_dirs", []):  # an opaque directory of our upper layer: nothing below shows
        shutil.rmtree(real_path(merged, target, True))
        os.mkdir(merged + target, 0o755)
    if libc.sethostname(cfg["hostname"].encode(), len(cfg["hostname"])) != 0:
        fail("sethostname")
    loopback_up()
    os.chdir(merged)
    if libc.syscall(SYS_PIVOT_ROOT, b".", b".") != 0:
        fail("pivot_root")
    if libc.umount2(b".", MNT_DETACH) != 0:  # the old root, stacked under the new one: detached, unreachable
        fail("umount old root")
    os.chdir("/")
    return upper_fd


def loopback_up():
    """A new network namespace's `lo` starts down: bring it up, so servers inside reach each other on 127.0.0.1 (a
    container's loopback works too); nothing else is there, so nothing else is reachable."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        got = fcntl.ioctl(sock, SIOCGIFFLAGS, struct.pack("16sH14s", b"lo", 0, b""))
        flags = struct.unpack("16sH14s", got)[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH14s", b"lo", flags | IFF_UP, b""))
    finally:
        sock.close()


def serve_as_init(stdin_fd, upper_fd):
    """Reap orphans until the owner closes our stdin; close `upper_fd` once the owner sends anything (it has its own)."""
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wake select() on every child exit
    while True:
        try:
            ready, _, _ = select.select([stdin_fd], [], [], 5.0)
        except InterruptedError:
            ready = []
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
        if ready:
            if not os.read(stdin_fd, 4096):
                os._exit(0)
            if upper_fd is not None:
                os.close(upper_fd)
                upper_fd = None


def read_config():
    line = b""
    while not line.endswith(b"\n"):
        chunk = os.read(0, 1)  # byte by byte: nothing after the line may be consumed here
        if not chunk:
            raise SystemExit("nsroot: no configuration on stdin")
        line += chunk
    return json.loads(line)


def main():
    cfg = read_config()
    stage_binds(cfg)
    unshare_and_map(cfg)
    ready_r, ready_w = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(ready_r)
        try:
            if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
                fail("prctl")
            upper_fd = build_root(cfg)
            os.write(ready_w, f"r{upper_fd}".encode())
            os.close(ready_w)
        except BaseException as exc:
            sys.stderr.write(f"nsroot: {exc}\n")
            sys.stderr.flush()
            os._exit(1)
        serve_as_init(0, upper_fd)
    os.close(ready_w)
    said = os.read(ready_r, 32)
    if said[:1] == b"r" and said[1:].isdigit():
        sys.stdout.write(f"READY {child} {said[1:].decode()}\n")
        sys.stdout.flush()
    os.close(ready_r)
    _, status = os.waitpid(child, 0)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


if __name__ == "__main__":
    main()
