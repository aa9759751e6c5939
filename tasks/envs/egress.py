"""The build egress proxy: the only way out of trajforge's build network (`buildnet.py`).

An asyncio forward proxy (HTTP absolute-URI requests and CONNECT tunnels) run in a thread of the process
that builds. Each build gets a token (`open_build`), named to it as the user of the proxy URL
(`http://TOKEN:x@GATEWAY:PORT`): a request without a known token is refused (407), so every connection is
a build's. Invariants:
- a destination is reached only if its host matches the build's allowlist (fnmatch patterns, `host` or
  `host:port`; a pattern without a port allows 80 and 443) and every address it resolves to is public:
  never loopback, private (10/8, 172.16/12, 192.168/16, fc00::/7), link-local, CGNAT, multicast,
  unspecified, one of this host's own addresses or inside a `forbidden` network (the build subnet).
  The proxy resolves names itself and connects to the address it checked (no second lookup: DNS
  rebinding gets nothing). An IP literal is a host like any other: on the allowlist or refused.
- a request reaches only the host it named: a plain request is forwarded with that host as its `Host`
  header, one request per connection; a tunnel whose TLS ClientHello names another server (SNI) is cut.
  What travels inside a tunnel's TLS is not seen: a CDN or a TLS-intercepting middlebox on the way that
  routes by the inner `Host` can still front for another host (outside this machine: the addresses above
  stay refused).
- every refusal is recorded per build as `Refusal(host, port, reason)` (`refusals(token)`) and answered
  at once (403), never left hanging; connects time out after `connect_timeout_s`, idle tunnels after
  `idle_timeout_s`.
"""

from __future__ import annotations

import asyncio
import base64
import fnmatch
import ipaddress
import secrets
import socket
import threading
from dataclasses import dataclass
from typing import Awaitable, Callable, Iterable

Resolver = Callable[[str, int], Awaitable[list[str]]]
# never a build's destination, whatever a name resolves to (besides loopback, link-local, multicast, unspecified)
BLOCKED_NETS = tuple(ipaddress.ip_network(n) for n in (
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7"))
DEFAULT_PORTS = (80, 443)
HEAD_LIMIT = 64 * 1024


@dataclass(frozen=True)
class Refusal:
    """A connection a build asked for and did not get: `host` and `port` as the build named them."""

    host: str
    port: int
    reason: str

    def __str__(self) -> str:
        return f"{self.host}:{self.port} ({self.reason})"


def host_addresses() -> set[str]:
    """This host's own addresses (every interface, IPv4 and IPv6), from the kernel's tables."""
    found: set[str] = set()
    try:
        with open("/proc/net/fib_trie") as f:
            lines = f.read().splitlines()
        for i, line in enumerate(lines):
            if "/32 host LOCAL" in line and i > 0:
                found.add(lines[i - 1].split("|--")[-1].strip())
    except OSError:
        pass
    try:
        with open("/proc/net/if_inet6") as f:
            for line in f:
                raw = line.split()[0]
                found.add(str(ipaddress.ip_address(int(raw, 16))))
    except OSError:
        pass
    return found


def forbidden_reason(address: str, own: set[str], forbidden: Iterable[ipaddress._BaseNetwork] = ()) -> str | None:
    """Why a build may not connect to `address` (None: it may)."""
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return "loopback"
    if str(ip) in own:
        return "this host's own address"
    if ip.is_link_local:
        return "link-local"
    if ip.is_multicast or ip.is_unspecified or ip.is_reserved and isinstance(ip, ipaddress.IPv4Address):
        return "not a unicast address"
    for net in (*BLOCKED_NETS, *forbidden):
        if ip.version == net.version and ip in net:
            return f"private ({net})"
    return None


def allowed(host: str, port: int, allowlist: Iterable[str]) -> bool:
    """`host:port` matches an allowlist pattern (`pattern` allows ports 80 and 443, `pattern:port` that port)."""
    host = host.lower().rstrip(".")
    for entry in allowlist:
        pattern, _, p = entry.lower().rpartition(":") if entry.count(":") == 1 else (entry.lower(), "", "")
        if fnmatch.fnmatchcase(host, pattern) and (port == int(p) if p else port in DEFAULT_PORTS):
            return True
    return False


async def _resolve(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(info[4][0] for info in infos))


class EgressProxy:
    """The proxy, serving on `bind` (the build network's gateway) from a daemon thread once `start()`ed."""

    def __init__(self, bind: str, port: int = 0, *, forbidden: Iterable[str] = (), resolver: Resolver | None = None,
                 connect_timeout_s: float = 15.0, idle_timeout_s: float = 120.0, head_timeout_s: float = 30.0,
                 screen: Callable[[str], str | None] | None = None):
        """`screen(address)`: why an address is refused (default `forbidden_reason` with this host's own
        addresses and `forbidden`; a test of the forwarding itself may pass its own)."""
        self.bind, self.port = bind, port
        self.forbidden = tuple(ipaddress.ip_network(n, strict=False) for n in forbidden)
        self.resolver = resolver or _resolve
        self.connect_timeout_s, self.idle_timeout_s, self.head_timeout_s = connect_timeout_s, idle_timeout_s, head_timeout_s
        self.own = host_addresses() | {bind}
        self.screen = screen or (lambda address: forbidden_reason(address, self.own, self.forbidden))
        self._builds: dict[str, tuple[tuple[str, ...], list[Refusal]]] = {}
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.AbstractServer | None = None
        self._thread: threading.Thread | None = None

    # ---- the builds' side ----
    def open_build(self, allowlist: Iterable[str]) -> str:
        token = secrets.token_hex(12)
        with self._lock:
            self._builds[token] = (tuple(allowlist), [])
        return token

    def url(self, token: str) -> str:
        return f"http://{token}:x@{self.bind}:{self.port}"

    def refusals(self, token: str) -> list[Refusal]:
        with self._lock:
            return list(self._builds.get(token, ((), []))[1])

    def close_build(self, token: str) -> list[Refusal]:
        with self._lock:
            return list(self._builds.pop(token, ((), []))[1])

    # ---- lifecycle ----
    def start(self) -> "EgressProxy":
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self._loop = loop
            try:
                self._server = loop.run_until_complete(asyncio.start_server(self._handle, self.bind, self.port))
                self.port = self._server.sockets[0].getsockname()[1]
            except BaseException as err:  # bind failed: reported by start()
                failure.append(err)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            self._server.close()
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in pending:  # open tunnels end with the proxy
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.close()

        self._thread = threading.Thread(target=run, name="trajforge-egress", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            raise OSError(f"the build egress proxy cannot listen on {self.bind}:{self.port}: {failure[0]}")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop = self._thread = None

    # ---- serving ----
    def _refuse(self, token: str | None, host: str, port: int, reason: str) -> Refusal:
        refusal = Refusal(host, port, reason)
        with self._lock:
            if token in self._builds:
                self._builds[token][1].append(refusal)
        return refusal

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.head_timeout_s)
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, ConnectionError):
                return
            await self._serve(head, reader, writer)
        except Exception:  # one broken client never stops the proxy
            pass
        finally:
            writer.close()

    async def _serve(self, head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        lines = head.decode("latin-1").split("\r\n")
        method, target, version = (lines[0].split(" ") + ["", "", ""])[:3]
        headers = [line for line in lines[1:] if line]
        token = _token(headers)
        connect = method.upper() == "CONNECT"
        host, port, path = _target(target, connect)
        if token is None or token not in self._builds:
            await _answer(writer, 407, "a build's proxy token is required")
            return
        if host is None:
            self._refuse(token, target[:200], 0, "not a proxy request")
            await _answer(writer, 400, f"not a proxy request: {target[:200]}")
            return
        upstream = await self._connect(token, host, port)
        if isinstance(upstream, Refusal):
            await _answer(writer, 403, f"trajforge build egress refused {upstream}")
            return
        up_reader, up_writer = upstream
        try:
            if connect:
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                await writer.drain()
                first = await self._client_hello(token, host, port, reader)
                if first is None:
                    return
                up_writer.write(first)
            else:  # the checked host is the Host header, one request per connection: nothing routes elsewhere
                kept = [h for h in headers if h.split(":", 1)[0].strip().lower()
                        not in ("proxy-authorization", "proxy-connection", "connection", "keep-alive", "host")]
                authority = (f"[{host}]" if ":" in host else host) + ("" if port == 80 else f":{port}")
                request = "\r\n".join([f"{method} {path} {version}", f"Host: {authority}", *kept,
                                        "Connection: close", "", ""])
                up_writer.write(request.encode("latin-1"))
                await up_writer.drain()
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        finally:
            up_writer.close()

    async def _connect(self, token: str, host: str, port: int):
        allowlist = self._builds[token][0]
        if not allowed(host, port, allowlist):
            return self._refuse(token, host, port, "not on the allowlist")
        try:
            addresses = await asyncio.wait_for(self.resolver(host, port), self.connect_timeout_s)
        except (OSError, asyncio.TimeoutError) as err:
            return self._refuse(token, host, port, f"does not resolve: {err}")
        for address in addresses:
            reason = self.screen(address)
            if reason:  # one forbidden address condemns the name (a rebinding name answers both)
                return self._refuse(token, host, port, f"resolves to {address}, {reason}")
        if not addresses:
            return self._refuse(token, host, port, "does not resolve")
        try:
            return await asyncio.wait_for(asyncio.open_connection(addresses[0], port), self.connect_timeout_s)
        except (OSError, asyncio.TimeoutError) as err:
            return self._refuse(token, host, port, f"connect to {addresses[0]} failed: {err or 'timed out'}")

    async def _client_hello(self, token: str, host: str, port: int, reader: asyncio.StreamReader) -> bytes | None:
        """The tunnel's first bytes; None (refused) when they are a TLS ClientHello naming another server
        than the CONNECT host (a front for a host off the list)."""
        try:
            first = await asyncio.wait_for(reader.read(5), self.head_timeout_s)
            if len(first) == 5 and first[0] == 0x16:
                first += await asyncio.wait_for(reader.readexactly(int.from_bytes(first[3:5], "big")),
                                                self.head_timeout_s)
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError):
            return None
        name = server_name(first)
        if name is not None and name.lower().rstrip(".") != host.lower().rstrip("."):
            self._refuse(token, host, port, f"TLS server name {name[:100]} is not the CONNECT host")
            return None
        return first

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                data = await asyncio.wait_for(reader.read(65536), self.idle_timeout_s)
                if not data:
                    break
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.TimeoutError):
            pass
        finally:
            try:
                if writer.can_write_eof():
                    writer.write_eof()
            except OSError:
                pass


def server_name(record: bytes) -> str | None:
    """The server name (SNI) of a TLS ClientHello record, None when it is not one or names none."""
    try:
        if len(record) < 43 or record[0] != 0x16 or record[5] != 0x01:
            return None
        i = 9 + 2 + 32  # record header 5, handshake header 4, version 2, random 32
        i += 1 + record[i]  # session id
        i += 2 + int.from_bytes(record[i:i + 2], "big")  # cipher suites
        i += 1 + record[i]  # compression methods
        end = i + 2 + int.from_bytes(record[i:i + 2], "big")
        i += 2
        while i + 4 <= min(end, len(record)):
            kind, size = int.from_bytes(record[i:i + 2], "big"), int.from_bytes(record[i + 2:i + 4], "big")
            if kind == 0 and record[i + 6] == 0:  # server_name list: first entry, host_name
                n = int.from_bytes(record[i + 7:i + 9], "big")
                return record[i + 9:i + 9 + n].decode("ascii", "replace")
            i += 4 + size
    except IndexError:
        return None
    return None


def _token(headers: list[str]) -> str | None:
    for h in headers:
        name, _, value = h.partition(":")
        if name.strip().lower() == "proxy-authorization":
            scheme, _, cred = value.strip().partition(" ")
            if scheme.lower() == "basic":
                try:
                    return base64.b64decode(cred.strip()).decode().partition(":")[0]
                except (ValueError, UnicodeDecodeError):
                    return None
    return None


def _target(target: str, connect: bool) -> tuple[str | None, int, str]:
    """(host, port, origin-form path) of a CONNECT authority or an absolute http:// URI (host None: neither)."""
    if connect:
        authority, rest = target, ""
    elif target.lower().startswith("http://"):
        authority, slash, rest = target[7:].partition("/")
        rest = slash + rest
    else:
        return None, 0, target
    host, port = authority.rsplit("@", 1)[-1], 443 if connect else 80
    if host.startswith("["):  # [v6]:port
        inner, _, tail = host[1:].partition("]")
        host = inner
        if tail.startswith(":") and tail[1:].isdigit():
            port = int(tail[1:])
    elif ":" in host:
        host, _, p = host.rpartition(":")
        if not p.isdigit():
            return None, 0, target
        port = int(p)
    return (host or None), port, rest or "/"


async def _answer(writer: asyncio.StreamWriter, status: int, text: str) -> None:
    reason = {400: "Bad Request", 403: "Forbidden", 407: "Proxy Authentication Required"}[status]
    body = (text + "\n").encode()
    writer.write(f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
                 f"Connection: close\r\n\r\n".encode() + body)
    try:
        await writer.drain()
    except OSError:
        pass
