"""An HTTP proxy that is a sandbox's only way out of its network namespace (a task image build's package registries).

The sandbox (`envs.runtime.nsroot`) has a network namespace of its own with nothing in it but loopback. `EgressProxy`
creates a listening socket *inside* that namespace (a short-lived thread `setns()`es into it, binds 127.0.0.1 there
and leaves), then starts this file as a process of the host's network namespace that serves that socket:
`CONNECT host:port` (https, git, pip, uv, npm) and absolute-form `GET http://host/...` (apt's Debian mirror). Every
destination is resolved here and refused, with a 403 and one line on stderr, when any of its addresses is loopback,
link-local (cloud metadata), unspecified, multicast, reserved, or an address of this host (one a socket of the host
could bind: every interface's, the docker bridges', AnyIP ranges); it then connects to the address it checked, so a
name that resolves elsewhere the second time changes nothing. What the sandbox can reach is therefore what a proxy-
aware client asks for on the far side of the host; never the host's own services, whichever address they listen on,
and never anything by a raw socket (there is no route out of the namespace).

The process drops to an unprivileged uid before it reads a byte, exits when its stdin closes (the owner's pipe), and
is stopped by its owner by pid. Standard library only: it runs as `python -I -S egress_proxy.py`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures.thread  # noqa: F401 (the resolver's threads; imported while this process can read them)
import ctypes
import encodings.idna  # noqa: F401 (an IDNA host name needs it: imported before the uid drop, as the one above)
import ipaddress
import os
import signal
import socket
import subprocess
import sys
import threading
from urllib.parse import urlsplit

CLONE_NEWNET = 0x40000000
HEAD_LIMIT = 64 << 10  # request line and headers
MAX_CONNECTIONS = 256  # open at once: more get a 503
TIMEOUT_S = 30.0  # to read a request's head, and to connect
HOP_HEADERS = (b"proxy-connection", b"proxy-authorization", b"connection", b"keep-alive")
NO_PROXY = "localhost,127.0.0.1,::1"  # the sandbox's own loopback stays direct (a server a build step starts)


# ----- which destinations are refused -----
def _binds_anything() -> bool:
    """Whether this host lets a socket bind an address it does not have (then no address can be told apart)."""
    for path in ("/proc/sys/net/ipv4/ip_nonlocal_bind", "/proc/sys/net/ipv6/ip_nonlocal_bind"):
        try:
            with open(path) as f:
                if f.read().strip() != "0":
                    return True
        except OSError:
            continue
    return False


def is_host_address(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether the kernel would deliver `ip` to this host: it lets a socket bind exactly those addresses."""
    family = socket.AF_INET if ip.version == 4 else socket.AF_INET6
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.bind((str(ip), 0))
        except OSError:
            return False
    return True


def refusal(address: str) -> str | None:
    """Why a connection to `address` is refused ("loopback", "an address of this host", ...), or None."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    for what, hit in (("loopback", ip.is_loopback), ("link-local", ip.is_link_local),
                      ("unspecified", ip.is_unspecified), ("multicast", ip.is_multicast),
                      ("reserved", ip.is_reserved)):
        if hit:
            return what
    if _binds_anything():
        return "not told apart from this host's own (ip_nonlocal_bind is on)"
    if is_host_address(ip):
        return "an address of this host"
    return None


async def resolve(host: str, port: int) -> list[tuple]:
    """The addresses to connect to; ValueError naming why when the destination is refused."""
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise ValueError(f"cannot resolve {host} ({exc})") from None
    for info in infos:
        why = refusal(info[4][0])
        if why is not None:
            raise ValueError(f"{host} is {info[4][0]}, {why}" if host != info[4][0] else f"{host} is {why}")
    if not infos:
        raise ValueError(f"{host} resolves to nothing")
    return infos


# ----- the server -----
def _say(line: str) -> None:
    sys.stderr.write(line.replace("\n", " ") + "\n")
    sys.stderr.flush()


async def _reply(writer: asyncio.StreamWriter, status: str, text: str) -> None:
    body = (text + "\n").encode()
    writer.write(f"HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
                 f"Connection: close\r\n\r\n".encode() + body)
    try:
        await writer.drain()
    finally:
        writer.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        writer.close()


async def _connect(infos: list[tuple]) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    error: OSError | None = None
    for family, _, _, _, address in infos:
        try:
            return await asyncio.wait_for(asyncio.open_connection(address[0], address[1], family=family), TIMEOUT_S)
        except (OSError, asyncio.TimeoutError) as exc:
            error = exc if isinstance(exc, OSError) else OSError(f"timed out after {TIMEOUT_S:g} s")
    raise error or OSError("no address")


def _origin_form(head: bytes) -> tuple[str, int, bytes]:
    """(host, port, the request as the origin server takes it) of an absolute-form `METHOD http://host/path` head."""
    line, _, rest = head.partition(b"\r\n")
    method, target, version = line.decode("latin-1").split(" ")
    url = urlsplit(target)
    if url.scheme != "http" or not url.hostname:
        raise ValueError(f"{method} {target}: only CONNECT and http:// requests go through this proxy")
    path = (url.path or "/") + (f"?{url.query}" if url.query else "")
    headers = [h for h in rest.split(b"\r\n") if h and h.split(b":", 1)[0].strip().lower() not in HOP_HEADERS]
    request = b"\r\n".join([f"{method} {path} {version}".encode("latin-1"), *headers, b"Connection: close", b"", b""])
    return url.hostname, url.port or 80, request


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, slots: asyncio.Semaphore) -> None:
    if slots.locked():
        await _reply(writer, "503 Service Unavailable", f"more than {MAX_CONNECTIONS} connections at once")
        return
    async with slots:
        try:
            await _serve_one(reader, writer)
        except Exception as exc:  # one line, not a traceback, and the server goes on
            _say(f"error: {type(exc).__name__}: {exc}")
            writer.close()


async def _serve_one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One client connection: its request's head, the destination checked, then bytes both ways until both close."""
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), TIMEOUT_S)
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, ConnectionError):
        writer.close()
        return
    first = head.split(b"\r\n", 1)[0].decode("latin-1", "replace")
    try:
        if first.upper().startswith("CONNECT "):
            url = urlsplit("//" + first.split(" ")[1])
            if not url.hostname or url.port is None:
                raise ValueError(f"{first}: CONNECT needs host:port")
            host, port, request = url.hostname, url.port, b""
        else:
            host, port, request = _origin_form(head)
        infos = await resolve(host, port)
    except (ValueError, IndexError) as exc:
        _say(f"refused {first}: {exc}")
        await _reply(writer, "403 Forbidden", f"nextstate build proxy: refused: {exc}")
        return
    try:
        up_reader, up_writer = await _connect(infos)
    except OSError as exc:
        await _reply(writer, "502 Bad Gateway", f"nextstate build proxy: {host}:{port}: {exc}")
        return
    if request:
        up_writer.write(request)
    else:
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
    await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
    up_writer.close()
    writer.close()


async def serve(listener: socket.socket, stop_fd: int = 0) -> None:
    """Serve `listener` until `stop_fd` (the owner's pipe: stdin) is readable, i.e. closed."""
    slots = asyncio.Semaphore(MAX_CONNECTIONS)
    done = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().add_reader(stop_fd, lambda: done.done() or done.set_result(None))
    server = await asyncio.start_server(lambda r, w: handle(r, w, slots), sock=listener, limit=HEAD_LIMIT)
    async with server:
        await done


def drop_privileges(uid: int) -> None:
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS


def main(argv: list[str]) -> None:
    fd, uid = int(argv[0]), int(argv[1])
    listener = socket.socket(fileno=fd)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    drop_privileges(uid)
    asyncio.run(serve(listener))


# ----- the owner's side -----
def listen_in_netns(pid: int) -> socket.socket:
    """A TCP socket listening on 127.0.0.1 (a free port) in the network namespace of `pid`. Needs root."""
    result: list[socket.socket | BaseException] = []

    def bind_there() -> None:  # in a thread of its own: setns() changes this thread's namespace only, and it ends
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            ns = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            try:
                if libc.setns(ns, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns into the network namespace of {pid}: {os.strerror(err)}")
            finally:
                os.close(ns)
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sock.listen(128)
            result.append(sock)
        except BaseException as exc:  # handed to the caller's thread
            result.append(exc)

    t = threading.Thread(target=bind_there, name="egress-proxy-listen")
    t.start()
    t.join()
    if isinstance(result[0], BaseException):
        raise result[0]
    return result[0]


class EgressProxy:
    """The proxy of one sandbox's network namespace (that of host pid `netns_pid`), run as host uid `uid`."""

    def __init__(self, netns_pid: int, *, uid: int):
        listener = listen_in_netns(netns_pid)
        try:
            self.port = listener.getsockname()[1]
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", __file__, str(listener.fileno()), str(uid)],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                pass_fds=(listener.fileno(),), start_new_session=True,
                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})
        finally:
            listener.close()  # the child holds it now
        self._lines: list[str] = []
        self._reader = threading.Thread(target=self._read_stderr, name="egress-proxy-log", daemon=True)
        self._reader.start()

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            if len(self._lines) < 100:
                self._lines.append(raw.decode(errors="replace").rstrip())

    @property
    def env(self) -> dict[str, str]:
        """What proxy-aware clients (apt, pip, uv, curl, wget, git, npm) read."""
        url = f"http://127.0.0.1:{self.port}"
        return {"http_proxy": url, "https_proxy": url, "HTTP_PROXY": url, "HTTPS_PROXY": url,
                "no_proxy": NO_PROXY, "NO_PROXY": NO_PROXY}

    def close(self) -> list[str]:
        """Stop it (by pid); the lines it wrote (one per refused destination)."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self._reader.join(timeout=5.0)
        return list(self._lines)


__all__ = ["EgressProxy", "NO_PROXY", "listen_in_netns", "refusal"]

if __name__ == "__main__":
    main(sys.argv[1:])
