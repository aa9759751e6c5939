"""The harness's tools mode: a host-side relay to a `tools` environment's MCP server, and the turns of
an episode in that mode (what is offered, how a reply becomes tool calls, what is recorded).

The server (`.tools/server.py`, tasks/envs/tools/server.py) runs INSIDE the sandbox, as the agent
user, in the work dir, under the per-command timeout, with no network: the host never runs
environment code. The protocol client (the SDK session over `docker exec -i`, listing and calling) is
tasks/envs/tools/client.py, shared with the validator; this module is the harness side.

One MCP client session per episode (client.py `ToolSession`: the SDK's `ClientSession` over the
server's stdio, `docker exec -i` as the agent user), opened at the first call and closed before the
episode settles (`close`), because:
- the state lives in SQLite (`store.db`), never in the server process, and each call is one
  transaction committed or rolled back before it is answered: a long-lived server keeps nothing a
  call could lose, and the end state read after `close` is every answered call's;
- it is how MCP clients use a stdio server (one start, `initialize` once, then calls), and the
  server's start-up (the SDK's import, ~1 s) is paid once per episode, not per call: a call in a
  held session answers in ~1 ms where a server process per call cost ~37 ms over `docker exec true`'s
  floor (benchmarks/mcp_session.py on main before this change: 751 vs 9.7 calls/s);
- the server is the environment's: a call that does not answer within the command timeout, or a
  server that crashes or exits, is `ServerFailed`: the server is killed, the step is recorded (exit
  code 3, `killed_by` "timeout" for a hang) and the episode ends as `SandboxError` naming the reason,
  the environment's fault (an infrastructure status, retried by the stage, never a model failure and
  never a pass); the model's call errors stay the model's.

Outcomes of a call (client.py): `ok`, `tool_error` (`isError: true`: a domain answer such as "no
such booking", NOT counted), `call_error` (the model's mistake: an unknown tool, answered on the host,
or arguments that are not a JSON object, hold a lone surrogate, or break the tool's schema: counted
like a format error and in `tool_call_errors`), `server_error` (no response, a crash, a timeout: the
episode ends, see above). The tools are listed once per image per process and offered as
OpenAI tool schemas, plus the harness's own `submit`.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from ...schemas.trajectory import TOOLS_HARNESS, Message, Step
from ..envs.tools.client import (
    EXIT_CODES,
    SURROGATE,
    Launch,
    Outcome,
    ServerFailed,
    ToolSession,
    clean,
    declared_tools,
    launch_of,
    list_tools,
    listed,
    recorded_tools,
)
from ..envs.tools.spec import call_command
from ..sandbox import SandboxError

__all__ = ["TOOLS_HARNESS", "SURROGATE", "ToolMode", "declared_tools", "launch_of", "recorded_tools", "parse_arguments", "parse_fenced", "openai_tools"]

SUBMIT = {"type": "function", "function": {
    "name": "submit", "description": "Declare the request finished.", "parameters": {"type": "object", "properties": {}}}}
TOOLS_SYSTEM_PROMPT = (
    "You are an assistant that completes the user's request using the tools provided; they are the only way "
    "to look up or change anything. Look up what you need before you act, and check the result. "
    "When the request is done, call the `submit` tool."
)
TOOLS_FENCED_HINT = (
    " Tool calling is unavailable: reply with exactly one tool call per turn as a ```json fenced block holding "
    '{{"tool": NAME, "arguments": {{...}}}}, and reply with the single word SUBMIT when the request is done. '
    "The tools (arguments as JSON Schema):\n{tools}"
)
JSON_FENCE = re.compile(r"```(?:json)?[ \t]*\n(.*?)```", re.S)
TOOL_CALL_TAG = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)


def has_surrogate(value: Any) -> bool:
    """A lone surrogate anywhere in decoded JSON (keys too): it cannot be encoded, stored or sent on."""
    return bool(SURROGATE.search(json.dumps(value, ensure_ascii=False)))


def parse_arguments(text: str | None) -> dict[str, Any] | str:
    """A tool call's arguments as a JSON object, else why not (both modes: nothing runs on such a call).
    A lone surrogate in a decoded key or value (an ASCII escape such as `\\ud800` carries one past
    `garbled`) is refused too."""
    try:
        args = json.loads(text or "{}")
    except (ValueError, RecursionError) as err:
        return clean(str(err))
    if not isinstance(args, dict):
        return "arguments must be a JSON object"
    if has_surrogate(args):
        return "the arguments hold invalid Unicode (a lone surrogate)"
    return args


def openai_tools(mcp_tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """MCP tool descriptions as OpenAI tool schemas."""
    return [{"type": "function", "function": {
        "name": t["name"], "description": t.get("description") or "",
        "parameters": t.get("inputSchema") or {"type": "object", "properties": {}}}} for t in mcp_tools]


def parse_fenced(text: str) -> tuple[str, dict[str, Any]] | str | None:
    """A fenced-mode reply: (tool, arguments) from its first ```json block, or from a
    `<tool_call>...</tool_call>` block (the Hermes format small instruct models such as SmolLM2 were
    trained on: `{"name": ..., "arguments": ...}`, or a list of them, the first one counts); `name` is
    taken for `tool`. An error text for a block that is not a call, None when there is no block."""
    blocks = JSON_FENCE.findall(text) or TOOL_CALL_TAG.findall(text)
    if not blocks or not blocks[0].strip():
        return None
    try:
        call = json.loads(blocks[0])
    except (ValueError, RecursionError) as err:
        return f"the ```json block is not valid JSON ({err})"
    if isinstance(call, list) and call:
        call = call[0]
    if isinstance(call, dict) and "tool" not in call and isinstance(call.get("name"), str):
        call = {**call, "tool": call["name"]}
    if not isinstance(call, dict) or not isinstance(call.get("tool"), str):
        return 'the ```json block must be an object {"tool": NAME, "arguments": {...}}'
    args = call.get("arguments", {})
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return "`arguments` must be a JSON object"
    if has_surrogate([call["tool"], args]):
        return "the ```json block holds invalid Unicode (a lone surrogate)"
    return call["tool"], args


def fenced_hint(mcp_tools: list[dict[str, Any]]) -> str:
    lines = "\n".join(f"- {t['name']}: {t.get('description') or ''} Arguments: "
                      f"{json.dumps(t.get('inputSchema') or {}, sort_keys=True)}" for t in mcp_tools)
    return TOOLS_FENCED_HINT.format(tools=lines)


class ToolMode:
    """The tools-mode turns of one episode, over the harness's `_Episode` (`ep`: sandbox, state,
    settings, `started`, `garbled`, the shared tool-call loop). Same contract as its bash mode: the
    history is stored as produced; each relayed call is a `Step` whose command is the call as the
    server's one-shot form (`call_command(name, arguments)`, tasks/envs/tools/spec.py: a recorded
    trajectory replays through the same server) with exit code 0 ok, 1 tool error, 2 call error, other:
    server error; and a `tool` message (a `user` message in fenced mode) with the result text, errors
    included. The model's call errors (unknown tool, answered on the host without running anything;
    arguments that are not a JSON object or break the tool's schema) count toward the consecutive
    format errors and in `tool_call_errors`; a server error (crash, timeout: the environment's fault)
    counts in neither and stays visible as its step's exit code (>= 3) and `killed_by`."""

    what = "tool call"

    def __init__(self, ep: Any, declared: list[dict[str, Any]] | None = None, launch: Launch | None = None):
        """`declared`: the environment's `.tools/tools.json` (`declared_tools`), which the validator
        proved its server lists exactly: offered without waiting for the container (a brought server
        declares none: its listing is asked for). `launch`: how its server starts (`launch_of`)."""
        self.ep, self.st, self.s, self.declared = ep, ep.st, ep.s, declared
        self.launch = launch or Launch()
        self.listed: list[dict[str, Any]] = []
        self.names: set[str] = set()
        self.session: ToolSession | None = None

    async def open(self) -> ToolSession:
        """The episode's session with its server (started once the container is up; the server's
        start-up is the environment's time, not the agent's budget)."""
        await self.ep.started
        if self.session is None:
            self.session = ToolSession(self.ep.sb, self.launch)
            t0 = time.monotonic()
            try:
                await self.session.start()
            except ServerFailed as err:
                raise SandboxError(f"tool server: {err}") from None
            self.st.deadline += time.monotonic() - t0
        return self.session

    async def close(self) -> None:
        """End the session (the server exits on EOF) before the episode settles; idempotent."""
        if self.session is not None:
            await self.session.close()

    async def offered(self) -> list[dict[str, Any]]:
        """The tools offered through the API (the server's + `submit`; none in fenced mode): the declared
        ones, else those the server listed for this image before in this process, else the server's
        listing (waits for this container)."""
        self.listed = self.declared or listed(self.ep.sb.image) or []
        if not self.listed:
            session = await self.open()
            try:
                self.listed = await list_tools(session)
            except ServerFailed as err:
                raise SandboxError(f"tool server: {err}") from None
        self.names = {t["name"] for t in self.listed}
        return openai_tools(self.listed) + [SUBMIT] if self.s.tool_calling else []

    def system_prompt(self, env: Any = None) -> str:
        return TOOLS_SYSTEM_PROMPT + ("" if self.s.tool_calling else fenced_hint(self.listed))

    def call_error(self, why: str) -> str:
        """The model's mistake, answered without running anything."""
        self.st.format_errors += 1
        self.st.call_errors += 1
        return f"call error: {why}"

    async def answer(self, turn: int, name: str, args: dict[str, Any] | str) -> str:
        """The result text of one call (`args`: the parsed arguments, or why they are not an object)."""
        if isinstance(args, str):
            return self.call_error(f"arguments are not a JSON object ({args})")
        if name not in self.names:
            return self.call_error(f"unknown tool {name!r}; the tools are: {', '.join(sorted(self.names))}")
        return (await self.relay(turn, name, args)).text

    async def relay(self, turn: int, name: str, arguments: dict[str, Any]) -> Outcome:
        session = await self.open()
        budget = min(self.s.command_timeout_s, max(1.0, self.st.deadline - time.monotonic()))
        t0 = time.monotonic()
        try:
            out = await session.call(name, arguments, budget)
        except ServerFailed as err:  # the environment's fault: recorded, then the episode ends
            self.st.steps.append(Step(turn=turn, command=call_command(name, arguments, self.launch.brought), exit_code=EXIT_CODES["server_error"],
                                      duration_s=round(time.monotonic() - t0, 4), timed_out=err.timed_out,
                                      killed_by="timeout" if err.timed_out else None, output_bytes=0, truncated=False))
            raise SandboxError(f"tool server: {err}") from None
        self.st.steps.append(Step(turn=turn, command=call_command(name, arguments, self.launch.brought), exit_code=out.exit_code,
                                  duration_s=round(out.duration_s, 4), timed_out=out.timed_out,
                                  killed_by=out.killed_by, output_bytes=out.output_bytes, truncated=out.truncated))
        if out.outcome == "call_error":
            self.st.format_errors += 1
            self.st.call_errors += 1
        else:  # a valid call
            self.st.format_errors = 0
        return out

    async def handle_tool_calls(self, turn: int, msg: Message) -> None:
        await self.ep.handle_tool_calls(turn, msg, self.answer)

    async def handle_text(self, turn: int, msg: Message, cut: bool = False) -> None:
        st = self.st
        if self.ep.garbled(msg):
            return
        text = msg.content or ""
        call = parse_fenced(text)
        if isinstance(call, tuple) and call[0] != "submit":
            result = await self.answer(turn, *call)
            st.messages.append(Message(role="user", content=f"Result of {call[0]}:\n{result}"))
        elif isinstance(call, tuple) or (call is None and re.search(r"\bSUBMIT\b", text)):
            st.submitted = True
        else:
            st.format_errors += 1
            why = call or ("your reply hit the token limit before any tool call" if cut else "no tool call found")
            st.messages.append(Message(role="user", content=(
                f"format error: {why}. Reply with one ```json block {{\"tool\": NAME, \"arguments\": {{...}}}}, "
                "or SUBMIT when done.")))
