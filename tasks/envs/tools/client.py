"""The host side of a `tools` environment's MCP server (`.tools/server.py`, see server.py): one MCP
client session (the official SDK's `ClientSession`) over the server's stdio in the sandbox, held for a
whole episode. The harness's relay (tasks/agent/mcp_relay.py) and the validator's `tools_serve`
check both use it.

Transport: `docker exec -i` through the Docker API (`exec_stdio`): the server runs as the agent user
in the work dir with the harness's PATH, its stdin and stdout carry the JSON-RPC lines the SDK reads
and writes, its stderr (tracebacks) is kept for diagnostics; nothing the model writes reaches a
shell (arguments travel as JSON inside the protocol). The engine is the sandbox's own client, so a
session works against any engine the sandbox does.

Invariants:
- the state is the store (`store.db`), never the server process: a session that died is not
  restarted mid-episode, and a new one (the next episode, the validator) sees the same store;
- a call that does not answer within its timeout, a server that exits, crashes or prints a protocol
  message over `MAX_MESSAGE_BYTES`, is `ServerFailed`: the session is closed and every process of the
  agent's in the sandbox (in tools mode: only servers) is killed; the harness ends the episode as the
  environment's fault, never the model's (`ToolMode.relay`);
- `close()` ends the session (EOF on the server's stdin, then the server exits) before the episode
  settles, so no server is left running to be counted as the agent's leftover.

Outcomes of a call: `ok` (the result text), `tool_error` (`isError: true`: a domain answer),
`call_error` (JSON-RPC -32602: the model's mistake). Every text is made encodable (a lone surrogate,
which a JSON escape in the model's arguments can carry back through a tool's answer, becomes U+FFFD).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import re
import socket
from collections import deque
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, AsyncIterator, Literal, Protocol

import anyio
from docker.utils.socket import read as socket_read
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from ....schemas.environment import EnvSpec
from ...sandbox.layer import HARNESS_PATH
from ...sandbox.users import USERS
from .layer import SDK_DIR
from .package import PKG_DIR, lock_of
from .spec import TOOL_NAME, TOOLS_DIR, parse_call_command

if TYPE_CHECKING:
    from mcp import ClientSession

SERVER_ARGV = ["python3", "-I", f"{TOOLS_DIR}/server.py"]
SERVER_COMMAND = " ".join(SERVER_ARGV)
MAX_MESSAGE_BYTES = 1 << 20  # one protocol message from the server (the model sees at most the sandbox's output limit)
START_TIMEOUT_S = 60.0  # the server's start-up and `initialize` (the SDK's import takes ~1 s)
EXIT_CODES = {"ok": 0, "tool_error": 1, "call_error": 2, "server_error": 3}
SURROGATE = re.compile("[\ud800-\udfff]")  # never valid in UTF-8 text (Parquet strings, JSON requests)

_LISTED: dict[str, list[dict[str, Any]]] = {}  # image -> the MCP tools its server lists (images are content-addressed)


class Sandboxed(Protocol):
    """What a session needs of a sandbox (tasks/sandbox/container.py `Sandbox`)."""

    image: str
    workdir: str
    agent: str
    cfg: Any  # `output_limit_bytes`: the most of a result the model is shown
    client: Any
    container: Any
    settled: bool

    def kill_agent_processes(self) -> int: ...


@dataclass
class Outcome:
    outcome: Literal["ok", "tool_error", "call_error", "server_error"]
    text: str  # what the model is shown
    exit_code: int
    duration_s: float = 0.0
    timed_out: bool = False
    killed_by: Literal["timeout", "oom"] | None = None
    output_bytes: int = 0
    truncated: bool = False
    ran: bool = True  # False: refused on the host, nothing ran in the sandbox


@dataclass(frozen=True)
class Launch:
    """How the server starts: `argv` in the work dir (`cwd`: a folder below it), with `TRAJFORGE_STORE`
    naming the store and the tools layer's SDK on PYTHONPATH. `brought`: an `mcp-server` folder's own
    server (`.tools/server.json`), else the environment's compiled `.tools/server.py`."""

    argv: tuple[str, ...] = tuple(SERVER_ARGV)
    cwd: str = ""
    brought: bool = False
    package: bool = False  # pinned as a package (tasks/envs/tools/package.py): installed in PKG_DIR

    def environment(self, workdir: str, home: str) -> dict[str, str]:
        env = {"HOME": home, "PATH": HARNESS_PATH, "TRAJFORGE_STORE": f"{workdir}/store.db", "PYTHONPATH": SDK_DIR,
               "PYTHONDONTWRITEBYTECODE": "1"}
        if self.package:  # the same as call.py's launch
            env.update(PATH=f"{PKG_DIR}/bin:{HARNESS_PATH}", PYTHONPATH=f"{PKG_DIR}/site:{SDK_DIR}",
                       NODE_PATH=f"{PKG_DIR}/node_modules")
        return env


def launch_of(files: list[Any]) -> Launch:
    """The launch an environment's files declare (`.tools/server.json`: `{"command": [...]}`), else the built-in one."""
    text = next((f.content for f in files if f.path.strip("/") == f"{TOOLS_DIR}/server.json"), None)
    if text is None:
        return Launch()
    spec = json.loads(text)
    if spec.get("package"):
        return Launch(tuple(spec["command"]), TOOLS_DIR, brought=True, package=True)
    return Launch(tuple(spec["command"]), f"{TOOLS_DIR}/server", brought=True)


class ServerFailed(RuntimeError):
    """The tool server did not start, answer, or stay up: the environment's fault (the reason is the message)."""

    def __init__(self, message: str, timed_out: bool = False):
        super().__init__(message)
        self.timed_out = timed_out


class ListingFailed(ServerFailed):
    """The tool server listed no tools (the validator's `tools_serve` check keeps such environments out)."""


def clean(text: str) -> str:
    """`text` made encodable as UTF-8 (lone surrogates become U+FFFD)."""
    return SURROGATE.sub("\ufffd", text)


def tail(text: str, n: int = 300) -> str:
    text = clean(text.strip())
    return text if len(text) <= n else "..." + text[-n:]


def cut(text: str, limit: int) -> tuple[str, bool]:
    """(`text` cut to `limit` UTF-8 bytes, head and tail kept; whether it was cut)."""
    data = clean(text).encode()
    if len(data) <= limit:
        return data.decode(), False
    half = limit // 2
    return (data[:half].decode(errors="ignore") + f"\n[... {len(data) - limit} bytes cut ...]\n"
            + data[-(limit - half):].decode(errors="ignore")), True


@asynccontextmanager
async def exec_stdio(sb: Sandboxed, launch: Launch, stderr: deque[str]) -> AsyncIterator[tuple[Any, Any]]:
    """The SDK's (read, write) streams over the server `launch` starts, run with `docker exec -i` as the
    agent (what `mcp.client.stdio.stdio_client` is for a local process). The server's stderr goes to
    `stderr` (the last lines). The streams end when the server exits or prints a message over
    MAX_MESSAGE_BYTES."""
    import mcp_types as types  # the SDK (a second of imports) loads where a tool session starts, not in every process
    from mcp.shared.message import SessionMessage

    api = sb.client.api
    workdir = f"{sb.workdir}/{launch.cwd}" if launch.cwd else sb.workdir
    exec_id = await anyio.to_thread.run_sync(lambda: api.exec_create(
        sb.container.id, list(launch.argv), stdin=True, stdout=True, stderr=True, user=USERS.get(sb.agent, sb.agent),
        workdir=workdir, environment=launch.environment(sb.workdir, "/root" if sb.agent == "root" else "/home/agent"))["Id"])
    sock = await anyio.to_thread.run_sync(lambda: api.exec_start(exec_id, socket=True))
    raw = getattr(sock, "_sock", sock)
    # the blocking read holds its thread for the whole session: threads of this session's own, never
    # tokens of anyio's shared limiter (40), which many concurrent episodes would exhaust
    threads = anyio.CapacityLimiter(2)
    read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)

    async def reader() -> None:
        pending, lines, errs = bytearray(), bytearray(), bytearray()
        async with read_writer:
            while True:
                data = await anyio.to_thread.run_sync(socket_read, sock, 65536, abandon_on_cancel=True, limiter=threads)
                if not data:
                    return
                pending += data
                while len(pending) >= 8:  # multiplexed frames: stream (1 stdout, 2 stderr), 0, 0, 0, size
                    size = int.from_bytes(pending[4:8], "big")
                    if len(pending) < 8 + size:
                        break
                    kind, payload = pending[0], bytes(pending[8:8 + size])
                    del pending[:8 + size]
                    if kind == 2:
                        errs += payload
                        *done, rest = errs.split(b"\n")
                        stderr.extend(d.decode(errors="replace") for d in done)
                        errs = bytearray(rest[-4096:])
                        continue
                    lines += payload
                    while b"\n" in lines:
                        line, _, rest = bytes(lines).partition(b"\n")
                        lines = bytearray(rest)
                        if line.strip():
                            try:
                                msg: SessionMessage | Exception = SessionMessage(
                                    types.jsonrpc_message_adapter.validate_json(line, by_name=False))
                            except ValueError as err:
                                msg = err
                            await read_writer.send(msg)
                    if len(lines) > MAX_MESSAGE_BYTES:
                        stderr.append(f"[trajforge] the server printed a message over {MAX_MESSAGE_BYTES} bytes")
                        return

    async def writer() -> None:
        async with write_reader:
            async for message in write_reader:
                data = (message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n").encode()
                await anyio.to_thread.run_sync(raw.sendall, data, limiter=threads)

    done = anyio.Event()

    async def read_all() -> None:
        try:
            await reader()
        finally:
            done.set()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(read_all)
            tg.start_soon(writer)
            try:
                yield read_stream, write_stream
            finally:
                try:
                    raw.shutdown(socket.SHUT_WR)  # EOF: the server ends its session and exits
                except OSError:
                    pass
                with anyio.move_on_after(5, shield=True):
                    await done.wait()
                tg.cancel_scope.cancel()
    finally:
        for close in (lambda: raw.shutdown(socket.SHUT_RDWR), sock.close):
            try:
                close()
            except Exception:
                pass


class ToolSession:
    """One MCP session with the tool server in `sb`, owned by a background task (the SDK's session and
    transport are entered and left there, whatever task calls). `start`, `list_tools`, `call`, `close`;
    any failure of the server is `ServerFailed` and leaves the session closed."""

    def __init__(self, sb: Sandboxed, launch: Launch | None = None):
        self.sb, self.launch = sb, launch or Launch()
        self.server_info: dict[str, Any] = {}
        self.stderr: deque[str] = deque(maxlen=40)
        self.session: ClientSession | None = None
        self.failure: ServerFailed | None = None
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._task: asyncio.Task | None = None

    def diagnostics(self) -> str:
        return tail("\n".join(self.stderr), 600)

    async def _own(self) -> None:
        from mcp import ClientSession

        try:
            async with exec_stdio(self.sb, self.launch, self.stderr) as (read, write), ClientSession(read, write) as s:
                init = await s.initialize()
                self.server_info = init.server_info.model_dump(mode="json", by_alias=True, exclude_none=True)
                self.session = s
                self._ready.set()
                await self._stop.wait()
        except BaseException as err:  # noqa: BLE001 (the owner reports every end; cancellation re-raised below)
            if self.failure is None and not self._stop.is_set():
                self.failure = ServerFailed(f"the tool server ended: {err.__class__.__name__}: {err}; "
                                            f"stderr: {self.diagnostics()!r}")
            if isinstance(err, asyncio.CancelledError):
                raise
        finally:
            self.session = None
            self._ready.set()

    async def start(self, timeout_s: float = START_TIMEOUT_S) -> "ToolSession":
        if self._task is None:
            self.sb.settled = False  # an agent process runs: the episode's settle must look for it
            self._task = asyncio.ensure_future(self._own())
        try:
            await asyncio.wait_for(self._ready.wait(), timeout_s)
        except asyncio.TimeoutError:
            await self.fail(f"the tool server did not start within {timeout_s:g}s", timed_out=True)
        if self.session is None:
            raise self.failure or ServerFailed("the tool server session is closed")
        return self

    async def fail(self, why: str, timed_out: bool = False) -> None:
        """Record `why`, close the session and kill the server (and any process it left); raises ServerFailed."""
        self.failure = self.failure or ServerFailed(f"{why}; stderr: {self.diagnostics()!r}", timed_out)
        await asyncio.to_thread(self.sb.kill_agent_processes)  # first: a hung server would not end on EOF
        await self.close()
        raise self.failure

    async def close(self, kill: bool = False) -> None:
        self._stop.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), 10)
            except BaseException:  # noqa: BLE001 (a transport that will not end: cancelled, the server killed below)
                self._task.cancel()
                kill = True
        if kill:
            await asyncio.to_thread(self.sb.kill_agent_processes)

    async def list_tools(self, timeout_s: float = START_TIMEOUT_S) -> list[dict[str, Any]]:
        """The tools the server lists, as MCP describes them (JSON objects, as `tools.json` holds them)."""
        from mcp.shared.exceptions import MCPError

        s = (await self.start(timeout_s)).session
        try:
            result = await asyncio.wait_for(s.list_tools(), timeout_s)
        except asyncio.TimeoutError:
            await self.fail(f"the tool server did not answer tools/list within {timeout_s:g}s", timed_out=True)
        except MCPError as err:
            raise ListingFailed(f"the tool server refused tools/list: {err}") from None
        except Exception as err:
            await self.fail(f"tools/list failed: {err.__class__.__name__}: {err}")
        return [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in result.tools]

    async def call(self, name: str, arguments: dict[str, Any], timeout_s: float) -> Outcome:
        """One `tools/call`; ServerFailed when the server does not answer in time or dies."""
        import mcp_types as types
        from mcp.shared.exceptions import MCPError

        s = (await self.start()).session
        t0 = asyncio.get_running_loop().time()
        try:
            result = await asyncio.wait_for(s.call_tool(name, arguments), timeout_s)
        except asyncio.TimeoutError:
            await self.fail(f"the tool {name!r} did not answer within {timeout_s:g}s and was stopped", timed_out=True)
        except MCPError as err:
            duration = asyncio.get_running_loop().time() - t0
            if err.error.code == types.INVALID_PARAMS:
                return self._outcome("call_error", f"call error: {err.error.message}", duration)
            if err.error.code == types.CONNECTION_CLOSED:
                await self.fail(f"the tool server ended during {name!r} (its connection closed)")
            await self.fail(f"the tool server answered {name!r} with error {err.error.code}: {err.error.message}")
        except Exception as err:
            await self.fail(f"the tool server ended during {name!r} ({err.__class__.__name__}: {err})")
        duration = asyncio.get_running_loop().time() - t0
        text = "\n".join(str(getattr(c, "text", "")) for c in result.content)
        return self._outcome("tool_error" if result.is_error else "ok", text, duration)

    def _outcome(self, outcome: str, text: str, duration: float) -> Outcome:
        shown, truncated = cut(text, self.sb.cfg.output_limit_bytes)
        return Outcome(outcome, shown, EXIT_CODES[outcome], duration, output_bytes=len(clean(text).encode()),  # type: ignore[arg-type]
                       truncated=truncated)


def run_sync(coro: Any) -> Any:
    """Run `coro` to completion from synchronous code (in its own thread: the caller may be in a loop)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


async def fetch_tools(sb: Sandboxed, timeout_s: float = START_TIMEOUT_S,
                      launch: Launch | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(the MCP tools the server lists, its `serverInfo`), from a session of its own (uncached: the
    validator's check)."""
    session = ToolSession(sb, launch)
    try:
        tools = await session.list_tools(timeout_s)
    finally:
        await session.close()
    if not tools:
        raise ListingFailed(f"the tool server of {sb.image} listed no tools; stderr: {session.diagnostics()!r}")
    return tools, session.server_info


async def list_tools(session: ToolSession, timeout_s: float = START_TIMEOUT_S) -> list[dict[str, Any]]:
    """The server's tools, listed once per image per process (through `session`)."""
    image = session.sb.image
    if image not in _LISTED:
        tools = await session.list_tools(timeout_s)
        if not tools:
            raise ListingFailed(f"the tool server of {image} listed no tools; stderr: {session.diagnostics()!r}")
        _LISTED[image] = tools
    return _LISTED[image]


def declared_tools(files: list[Any]) -> list[dict[str, Any]] | None:
    """The tools an environment's `.tools/tools.json` declares (None: no such file, not JSON, or not a
    list). The validator's `tools_serve` admits an environment only if its server lists exactly these."""
    text = next((f.content for f in files if f.path.strip("/") == f"{TOOLS_DIR}/tools.json"), None)
    try:
        tools = json.loads(text) if text is not None else None
    except ValueError:
        return None
    return tools if isinstance(tools, list) else None


def recorded_tools(env: EnvSpec) -> list[dict[str, Any]] | None:
    """The tools the validator recorded for a brought server (`EnvSpec.tool_server`), None if none."""
    if not env.tool_server:
        return None
    tools = json.loads(env.tool_server).get("tools")
    return tools if isinstance(tools, list) and tools else None


def listed(image: str) -> list[dict[str, Any]] | None:
    """The tools already listed for `image` in this process (None: not yet)."""
    return _LISTED.get(image)


def serve_error(sb: Sandboxed, env: EnvSpec, timeout_s: float) -> str | None:
    """The validator's `tools_serve` check: why the tool server of a `tools` environment is unusable
    (None: a session starts and lists tools with shell-safe names and valid JSON Schemas of objects:
    exactly those of its `.tools/tools.json`, or, for a brought server, the same list in two sessions,
    recorded with the server's name and version in `env.tool_server`)."""
    launch = launch_of(env.files)
    want = None
    if not launch.brought:
        declared = next((f.content for f in env.files if f.path.strip("/") == f"{TOOLS_DIR}/tools.json"), None)
        try:
            want = json.loads(declared) if declared is not None else None
        except ValueError as err:
            return f".tools/tools.json is not JSON: {err}"
        if not isinstance(want, list):
            return "the environment has no .tools/tools.json listing its tools"
    try:
        got, info = run_sync(fetch_tools(sb, timeout_s, launch))
        if launch.brought:
            want, _ = run_sync(fetch_tools(sb, timeout_s, launch))  # a second session lists the same tools
    except ServerFailed as err:
        return f"the tool server did not list its tools: {err}"
    if got != want:
        names = sorted(t.get("name", "?") for t in got)
        if launch.brought:
            return f"the server lists different tools in two sessions: {names}, then {sorted(t.get('name', '?') for t in want)}"
        return f"the server lists {names}, not the tools of .tools/tools.json {sorted(t.get('name', '?') for t in want)}"
    for t in got:
        schema = t.get("inputSchema")
        if not TOOL_NAME.match(t["name"]):
            return f"tool {t['name']!r}: a name of letters, digits, '_', '.', '-' (at most 128) is required"
        try:
            Draft202012Validator.check_schema(schema if isinstance(schema, dict) else {"type": 0})
        except SchemaError as err:
            return f"tool {t['name']!r}: inputSchema is not a valid JSON Schema: {err.message}"
        if schema.get("type") != "object" or t["name"] == "submit":
            return f"tool {t['name']!r}: inputSchema must have type 'object' (and `submit` is the harness's)"
    if launch.brought:
        schemas = {t["name"]: t.get("inputSchema") for t in got}
        for command in env.solution:  # the oracle's calls must fit the schemas the server lists
            parsed = parse_call_command(command)
            if parsed is None or parsed[0] not in schemas:
                return f"the reference solution's {command[:120]!r} calls no tool the server lists {sorted(schemas)}"
            errors = sorted(Draft202012Validator(schemas[parsed[0]]).iter_errors(parsed[1]), key=str)
            if errors:
                return (f"the reference solution's arguments for {parsed[0]!r} do not fit the inputSchema the "
                        f"server lists: {errors[0].message}")
        server = {"name": info.get("name"), "version": info.get("version"), "tools": got}
        lock = lock_of(env.files)
        if lock:  # pinned as a package: what was installed
            server["package"] = {k: lock[k] for k in ("manager", "name", "version")}
        env.tool_server = json.dumps(server, sort_keys=True)
    return None


STORE_FILES = ("store.db", "store.db-journal", "store.db-wal", "store.db-shm")


def outside_store(env: EnvSpec, changed: list[str]) -> str | None:
    """Why the reference solution's changes are not confined to the store (None: they are): a tool server
    writes its state in `store.db` in the work dir and nowhere else."""
    allowed = {f"{env.workdir}/{name}" for name in STORE_FILES}
    stray = sorted(p for p in changed if p not in allowed)
    return f"the tool server wrote outside its store: {', '.join(stray[:8])}" if stray else None
