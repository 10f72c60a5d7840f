"""Starts a throwaway-root sandbox and then serves as its init. Run as a script by `envs.runtime.nsroot` (only the
standard library: it runs before anything else exists), as root.

    python -I -S nsroot_init.py < (one line of JSON config, then the pipe stays open: the sandbox lives as long as it)

Steps (why each is here rather than in bubblewrap: bubblewrap always sets no_new_privs, so `sudo` could never work in
it, and Debian's 0.8 cannot mount an overlay):
1. Open the directories to bind while we can still reach them (an O_PATH fd passes paths the sandbox uid could not
   traverse, e.g. under /root).
2. unshare user, mount, pid, network, IPC, UTS and cgroup namespaces. A helper child (still in the parent user
   namespace, and root: only root may map a range) maps uids and gids 0..count-1 of the new user namespace onto host
   uids `uid_base`.., so the sandbox's root is a non-root host uid and no host uid below `uid_base` exists inside.
3. Fork the namespace's pid 1, which mounts: a size-capped tmpfs holding the overlay's upper layer (so nothing written
   reaches the host's disk, and all of it vanishes with the namespace; or the owner's directory, `scratch_tmpfs`
   false), the overlay (lower = the root tree, read-only),
   a fresh /proc, a minimal /dev (null, zero, full, random, urandom, tty, a private devpts, /dev/shm), a tmpfs /tmp, the
   configured binds, the loopback interface up; then pivot_root into the overlay and detaches the old root, so no host
   path is reachable.
4. pid 1 prints nothing itself; the launcher prints `READY <host pid of pid 1>` and waits. pid 1 reaps orphans and exits
   when its stdin (a pipe from the owner) closes, or when the launcher dies (PDEATHSIG): the kernel then kills every
   process of the namespace.
"""

import ctypes
import fcntl  # imported here, as the host's root: inside, the interpreter's own files may be out of reach
import json
import os
import select
import signal
import socket
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


def unshare_and_map(cfg, open_binds):
    """unshare, have a helper (still in the parent user namespace) write our uid/gid maps, open the bind sources (still
    with the owner's file access, and in the new mount namespace, where a bind may take them from), become root of
    the namespace. Returns the bind fds."""
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
    fds = open_binds()
    os.setgroups([])
    os.setresgid(0, 0, 0)
    os.setresuid(0, 0, 0)
    return fds


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


def build_root(cfg, fds):
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    scratch, merged = cfg["scratch"], cfg["merged"]
    # the overlay's upper layer lives in a tmpfs of this mount namespace: capped, and gone with it (unless the owner
    # keeps it in a directory of its own, `scratch_tmpfs` false: capped and removed by that owner)
    if cfg.get("scratch_tmpfs", True):
        mount("tmpfs", scratch, "tmpfs", MS_NOSUID | MS_NODEV, f"mode=700,size={int(cfg['upper_bytes'])}")
    os.makedirs(scratch + "/upper", exist_ok=True)
    os.makedirs(scratch + "/work", exist_ok=True)
    # by path, not by fd: overlayfs clones its layers, which it may only do from this mount namespace
    opts = f"lowerdir={cfg['lower']},upperdir={scratch}/upper,workdir={scratch}/work"
    if cfg.get("userxattr"):
        opts += ",userxattr"
    mount("overlay", merged, "overlay", 0, opts)
    mount("proc", merged + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    make_dev(merged)
    if cfg["tmp_bytes"]:  # 0: the tree's own /tmp (an image build keeps what a step leaves there, as docker does)
        mount("tmpfs", merged + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={int(cfg['tmp_bytes'])}")
    for i, b in enumerate(cfg["binds"]):
        target = merged + b["target"]
        if os.path.isdir(f"/proc/self/fd/{fds[i]}"):
            os.makedirs(target, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            open(target, "a").close()
        bind(f"/proc/self/fd/{fds[i]}", target, b.get("readonly", True))
    if libc.sethostname(cfg["hostname"].encode(), len(cfg["hostname"])) != 0:
        fail("sethostname")
    loopback_up()
    os.chdir(merged)
    if libc.syscall(SYS_PIVOT_ROOT, b".", b".") != 0:
        fail("pivot_root")
    if libc.umount2(b".", MNT_DETACH) != 0:  # the old root, stacked under the new one: detached, unreachable
        fail("umount old root")
    os.chdir("/")


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


def serve_as_init(stdin_fd):
    """Reap orphans until the owner closes our stdin."""
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
        if ready and not os.read(stdin_fd, 4096):
            os._exit(0)


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
    fds = unshare_and_map(cfg, lambda: {i: os.open(b["source"], os.O_PATH | os.O_CLOEXEC) for i, b in
                                        enumerate(cfg["binds"])})
    ready_r, ready_w = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(ready_r)
        try:
            if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
                fail("prctl")
            build_root(cfg, fds)
            for fd in fds.values():
                os.close(fd)
            os.write(ready_w, b"r")
            os.close(ready_w)
        except BaseException as exc:
            sys.stderr.write(f"nsroot: {exc}\n")
            sys.stderr.flush()
            os._exit(1)
        serve_as_init(0)
    os.close(ready_w)
    for fd in fds.values():
        os.close(fd)
    if os.read(ready_r, 1) == b"r":
        sys.stdout.write(f"READY {child}\n")
        sys.stdout.flush()
    os.close(ready_r)
    _, status = os.waitpid(child, 0)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


if __name__ == "__main__":
    main()
