"""The host side of the protocol to a `tools` environment's MCP server (`.tools/server.py`, see
server.py): what the validator's `tools_serve` check and the harness's relay (tasks/agent/mcp_relay.py)
both speak. It needs only a sandbox-like object: `exec(command, timeout_s, output_limit=)` returning an
`ExecResult` (and `image`, `cfg.output_limit_bytes` for listing once per image and cutting results).

One server process per session: the JSON-RPC lines go in base64-encoded inside the command
(`printf %s B64 | base64 -d | python3 -I .tools/server.py`), so nothing a model writes ever reaches a
shell (the base64 alphabet has no shell syntax). Each request carries a fresh random id (a nonce):
whatever a tool prints to stderr (merged into the output, kept for crash diagnostics) cannot pass for
the server's reply, since it cannot know the id.

Outcomes of a call: `ok` (the result text), `tool_error` (`isError: true`: a domain answer),
`call_error` (JSON-RPC -32602 or arguments too long: the model's mistake), `server_error` (no reply,
a crash, a timeout: the environment's fault). Every text is made encodable (a lone surrogate, which a
JSON escape in the model's arguments can carry back through a tool's answer, becomes U+FFFD).
"""

from __future__ import annotations

import base64
import json
import re
import secrets
import shlex
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from ....schemas.environment import EnvSpec
from .spec import TOOLS_DIR

PROTOCOL = "2025-06-18"  # the MCP revision server.py speaks (its own PROTOCOL; a test keeps them equal)
SERVER_COMMAND = f"python3 -I {TOOLS_DIR}/server.py"
RELAY_OUTPUT_LIMIT = 1 << 20  # what one server run may print (the model sees at most the sandbox's output limit)
MAX_REQUEST_BYTES = 64 << 10  # one command argument must stay below Linux's 128 KiB per-argument limit
EXIT_CODES = {"ok": 0, "tool_error": 1, "call_error": 2}  # a server error keeps the process's code (3 if 0-2)
SURROGATE = re.compile("[\ud800-\udfff]")  # never valid in UTF-8 text (Parquet strings, JSON requests)

_LISTED: dict[str, list[dict[str, Any]]] = {}  # image -> the MCP tools its server lists (images are content-addressed)


class Execs(Protocol):
    image: str
    cfg: Any  # `output_limit_bytes`: the most of a result the model is shown

    def exec(self, command: str, timeout_s: float, output_limit: int | None = None) -> Any: ...


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


def clean(text: str) -> str:
    """`text` made encodable as UTF-8 (lone surrogates become U+FFFD)."""
    return SURROGATE.sub("\ufffd", text)


def session_command(messages: list[dict[str, Any]]) -> str:
    """The shell command that runs one server session fed `messages` (one JSON-RPC line each, then EOF)."""
    payload = base64.b64encode("".join(json.dumps(m) + "\n" for m in messages).encode()).decode()
    return f"printf %s {shlex.quote(payload)} | base64 -d | {SERVER_COMMAND}"


def nonce() -> str:
    return secrets.token_hex(8)


def opening(rid: str, method: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """initialize + notifications/initialized + one request `method` with id `rid`."""
    hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": {"name": "trajforge", "version": "1"}}}
    req = {"jsonrpc": "2.0", "id": rid, "method": method, **({"params": params} if params is not None else {})}
    return [hello, {"jsonrpc": "2.0", "method": "notifications/initialized"}, req]


def responses(output: str) -> dict[Any, dict[str, Any]]:
    """The JSON-RPC responses in a server's output, by id; any other line (a traceback, noise) is ignored."""
    out: dict[Any, dict[str, Any]] = {}
    for line in output.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            msg = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(msg, dict) and msg.get("jsonrpc") == "2.0" and "id" in msg and ("result" in msg or "error" in msg):
            try:
                out.setdefault(msg["id"], msg)
            except TypeError:  # an unhashable id: not ours
                continue
    return out


def tail(text: str, n: int = 300) -> str:
    text = clean(text.strip())
    return text if len(text) <= n else "..." + text[-n:]


def fetch_tools(sb: Execs, timeout_s: float = 60) -> tuple[list[dict[str, Any]] | None, str]:
    """(the MCP tools the server lists, None if it lists none; its output): uncached (the validator's check)."""
    rid = nonce()
    res = sb.exec(session_command(opening(rid, "tools/list")), timeout_s, output_limit=RELAY_OUTPUT_LIMIT)
    reply = responses(res.output).get(rid) or {}
    tools = (reply.get("result") or {}).get("tools") if isinstance(reply.get("result"), dict) else None
    ok = isinstance(tools, list) and all(isinstance(t, dict) and isinstance(t.get("name"), str) for t in tools)
    return (tools if ok else None), res.output


class ListingFailed(RuntimeError):
    """The tool server listed no tools (the validator's `tools_serve` check keeps such environments out)."""


def list_tools(sb: Execs, timeout_s: float = 60) -> list[dict[str, Any]]:
    """The server's tools, once per image per process; ListingFailed when the server lists none."""
    if sb.image not in _LISTED:
        tools, output = fetch_tools(sb, timeout_s)
        if tools is None:
            raise ListingFailed(f"the tool server of {sb.image} listed no tools: {tail(output)!r}")
        _LISTED[sb.image] = tools
    return _LISTED[sb.image]


def declared_tools(files: list[Any]) -> list[dict[str, Any]] | None:
    """The tools an environment's `.tools/tools.json` declares (None: no such file, not JSON, or not a
    list). The validator's `tools_serve` admits an environment only if its server lists exactly these."""
    text = next((f.content for f in files if f.path.strip("/") == f"{TOOLS_DIR}/tools.json"), None)
    try:
        tools = json.loads(text) if text is not None else None
    except ValueError:
        return None
    return tools if isinstance(tools, list) else None


def listed(image: str) -> list[dict[str, Any]] | None:
    """The tools already listed for `image` in this process (None: not yet)."""
    return _LISTED.get(image)


def cut(text: str, limit: int) -> tuple[str, bool]:
    """(`text` cut to `limit` UTF-8 bytes, head and tail kept; whether it was cut)."""
    data = clean(text).encode()
    if len(data) <= limit:
        return data.decode(), False
    half = limit // 2
    return (data[:half].decode(errors="ignore") + f"\n[... {len(data) - limit} bytes cut ...]\n"
            + data[-(limit - half):].decode(errors="ignore")), True


def call_tool(sb: Execs, name: str, arguments: dict[str, Any], timeout_s: float) -> Outcome:
    """One tool call through a fresh server process in the sandbox (see the module docstring)."""
    rid = nonce()
    cmd = session_command(opening(rid, "tools/call", {"name": name, "arguments": arguments}))
    if len(cmd) > MAX_REQUEST_BYTES:
        return Outcome("call_error", f"call error: the arguments are too long ({len(cmd)} bytes encoded; "
                                     f"at most {MAX_REQUEST_BYTES})", 2, ran=False)
    res = sb.exec(cmd, timeout_s, output_limit=RELAY_OUTPUT_LIMIT)
    reply = responses(res.output).get(rid)
    if res.timed_out or res.killed_by or reply is None:
        if res.timed_out:
            why = f"the tool did not answer within {timeout_s:g}s and was stopped"
        elif res.killed_by == "oom":
            why = "the tool ran out of memory and was stopped"
        else:
            why = f"the tool server ended (exit code {res.exit_code}) without an answer: {tail(res.output, 200)}"
        code = res.exit_code if res.exit_code not in (0, 1, 2) else 3
        text, outcome = f"tool server error: {why}", "server_error"
    elif "error" in reply:
        err = reply["error"] if isinstance(reply["error"], dict) else {}
        outcome = "call_error" if err.get("code") == -32602 else "server_error"
        text = f"{'call' if outcome == 'call_error' else 'tool server'} error: {err.get('message', reply['error'])}"
        code = EXIT_CODES.get(outcome, 3)
    else:
        result = reply.get("result") if isinstance(reply.get("result"), dict) else {}
        text = "\n".join(str(c.get("text", "")) for c in result.get("content") or [] if isinstance(c, dict))
        outcome = "tool_error" if result.get("isError") else "ok"
        code = EXIT_CODES[outcome]
    shown, truncated = cut(text, sb.cfg.output_limit_bytes)
    return Outcome(outcome, shown, code, res.duration_s, res.timed_out, res.killed_by, len(clean(text).encode()),
                   truncated or res.truncated)


def serve_error(sb: Execs, env: EnvSpec, timeout_s: float) -> str | None:
    """The validator's `tools_serve` check: why the tool server of a `tools` environment is unusable
    (None: it lists exactly the tools of its `.tools/tools.json`, each with a valid JSON Schema of
    an object)."""
    declared = next((f.content for f in env.files if f.path.strip("/") == ".tools/tools.json"), None)
    try:
        want = json.loads(declared) if declared is not None else None
    except ValueError as err:
        return f".tools/tools.json is not JSON: {err}"
    if not isinstance(want, list):
        return "the environment has no .tools/tools.json listing its tools"
    got, output = fetch_tools(sb, timeout_s)
    shown = f"\nserver output: {output[-800:]}"
    if got is None:
        return "the tool server did not answer tools/list" + shown
    if got != want:
        names = sorted(t.get("name", "?") for t in got)
        return f"the server lists {names}, not the tools of .tools/tools.json {sorted(t.get('name', '?') for t in want)}" + shown
    for t in got:
        schema = t.get("inputSchema")
        try:
            Draft202012Validator.check_schema(schema if isinstance(schema, dict) else {"type": 0})
        except SchemaError as err:
            return f"tool {t['name']!r}: inputSchema is not a valid JSON Schema: {err.message}" + shown
        if schema.get("type") != "object" or t["name"] == "submit":
            return f"tool {t['name']!r}: inputSchema must have type 'object' (and `submit` is the harness's)" + shown
    return None
