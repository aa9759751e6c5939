"""The agent harness: one episode = system prompt + instruction, then turns of teacher message ->
sandbox commands -> observations, until `submit`, max turns, the context budget, or the episode
timeout.

Invariants: the history is stored linearly exactly as produced (assistant messages untouched,
observations as `tool` messages, or `user` messages in fenced-bash mode), with the tool schemas
offered and per-turn token counts (and token ids/logprobs when the server returns them); every
command is a `Step` with exit code, duration and why it was killed; a command never runs past the
episode deadline; infrastructure failures raise SandboxError (the caller retries) and are never
recorded as the model's outcome, while a container the agent's own processes stopped ends the episode as
`agent_killed_sandbox` (tasks/sandbox/stopped.py: the engine was asked for no stop) and is judged on its
files; the work dir is captured after every agent process is killed and the protected paths are
checksummed; only then, with venue `fresh` (the default: a new container made from a commit of the stopped
episode container, tasks/sandbox/fresh.py) or `in_place` (this container), are the
hidden tests copied in and run as root (tasks/judge/verifier.py, tasks/judge/venue.py). The captured state allows an isolated
re-test later. The container starts while the teacher writes its first turn; the "before" checksums
of an image are computed once per process (containers of one image start identical).

The turn protocol is the harness's (tasks/agent/harnesses: tools offered, prompt, parsing, ending, replay
rendering): by default the environment's kind's own (tasks/envs/kinds.py, its `agent_mode` a key of `MODES`:
`bash` offers `bash` + `submit`, this module; `mcp` offers the environment's MCP tools + `submit` and relays
each call to its server in the sandbox, `ToolMode`, tasks/agent/mcp_relay.py), else the registered harness
named by `run_episode(harness=...)`. Everything after the turns (settle, capture, in-place tests) is shared.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Protocol

from ...schemas.common import ChangeSet
from ...schemas.environment import EnvSpec
from ...schemas.trajectory import Message, Rollout, Step, TurnUsage
from ..envs.kinds import BASH_HARNESS
from ..envs.kinds import of as kind_of
from ..judge.changes import capture_outside, expected
from ..judge.hacks import odd_links, own_files
from ..judge.venue import named
from ..judge.verifier import run_hidden_tests
from ..sandbox import ExecResult, FinalStateUnavailable, Sandbox, SandboxStopped
from ..teachers import ContextOverflow, TeacherError, TeacherSession
from ..teachers.tokens import split_prompt
from .mcp_relay import SURROGATE, ToolMode, declared_tools, launch_of, parse_arguments, recorded_tools

HARNESS = BASH_HARNESS
SYSTEM_PROMPT = (
    "You are an expert at the Linux command line, working in a sandbox with no network access. "
    "Your working directory is {workdir}. Each command runs in a fresh bash shell in that directory "
    "(cd does not persist between commands). Use the `bash` tool to inspect files, act, and check "
    "your result. When the task is done, call the `submit` tool."
)
FENCED_HINT = (" Tools are unavailable: reply with exactly one command in a ```bash fenced block per turn, "
               "and reply with the single word SUBMIT when the task is done.")
TOOLS = [
    {"type": "function", "function": {
        "name": "bash", "description": "Run a bash command in the sandbox; returns exit code and output.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}},
    {"type": "function", "function": {
        "name": "submit", "description": "Declare the task finished.",
        "parameters": {"type": "object", "properties": {}}}},
]
FENCE = re.compile(r"```(?:bash|sh|shell)?\s*\n(.*?)```", re.S)
MAX_CONSECUTIVE_FORMAT_ERRORS = 3


class HarnessUnavailable(RuntimeError):
    """The episode's image lacks what its harness needs (e.g. tmux): raised by a mode's `offered()`, the episode
    ends as `harness_unavailable` before any turn (nothing asked of the teacher), its error naming what is missing."""


def harness_label(env: EnvSpec, harness: str | None = None) -> str:
    """`Rollout.harness` of an episode of `env` under `harness` (None: its kind's own)."""
    return harness or kind_of(env).harness


def rollout_id(env_id: str, teacher: str, sample: int, harness: str | None = None) -> str:
    """Deterministic in (env, teacher, sample) and `harness` when it is not the kind's own (`harnesses.episode_harness`:
    None then, so the ids of the default episodes never changed)."""
    key = f"{env_id}|{teacher}|{sample}" + (f"|{harness}" if harness else "")
    return hashlib.sha256(key.encode()).hexdigest()[:16]


@dataclass
class EpisodeSettings:
    max_turns: int
    command_timeout_s: float
    episode_timeout_s: float
    tool_calling: bool = True
    final_state_limit: int = 8 << 20
    context_budget: int | None = None  # prompt + completion tokens a request may need at most
    max_tokens: int = 512
    venue: str = "isolated"  # where the hidden tests run (tasks/judge/venue.py); fresh / in_place: once the episode ended
    test_timeout_s: float = 60
    teacher_max_wait_s: float = 600  # teacher time allowed per turn (teacher.max_wait_s)
    agent_tokens_per_s: float = 20  # the agent is charged its generation at this speed at most


@dataclass
class _State:
    messages: list[Message]
    deadline: float
    steps: list[Step] = field(default_factory=list)
    usage: list[TurnUsage] = field(default_factory=list)
    submitted: bool = False
    format_errors: int = 0  # consecutive
    call_errors: int = 0  # tools mode: the model's call errors in the whole episode (Rollout.tool_call_errors)
    sequence: list[int] = field(default_factory=list)  # the last turn's prompt + completion ids (teachers.tokens)
    ended: tuple[str, str | None] | None = None  # (status, error): a mode whose own loop ended the episode

    def prompt_delta(self, prompt: list[int] | None, completion: list[int] | None) -> dict[str, Any]:
        """TurnUsage's `prompt_shared_len` / `prompt_new_token_ids` for a turn whose server returned
        `prompt` ids (none: nothing recorded, and the next turn's prompt is stored whole)."""
        if prompt is None:
            self.sequence = []
            return {}
        shared, new = split_prompt(self.sequence, prompt)
        self.sequence = [*prompt, *(completion or [])]
        return {"prompt_shared_len": shared, "prompt_new_token_ids": new}


def _observation(res: ExecResult) -> str:
    why = {"timeout": " [killed: command timed out]", "oom": " [killed: out of memory]"}.get(res.killed_by or "", "")
    return f"[exit code {res.exit_code}]{why}\n{res.output}".rstrip()


_BEFORE: dict[tuple[str, tuple[str, ...]], dict[str, str]] = {}  # (image, protected globs) -> digests


class _Episode:
    """The sandbox side of one episode: started in the background, awaited before the first command.
    Also the bash mode's turns (`offered`, `system_prompt`, `handle_*`; `ToolMode` is the tools mode's)."""

    what = "command"  # what a valid reply carries (the format-error message)

    def __init__(self, sb: Sandbox, st: _State, s: EpisodeSettings, protected: list[str]):
        self.sb, self.st, self.s, self.protected = sb, st, s, protected
        self.before: dict[str, str] = {}
        self.started = asyncio.ensure_future(asyncio.to_thread(self._start))

    def _start(self) -> None:
        self.sb.start()
        key = (self.sb.container.attrs.get("Image") or self.sb.image, tuple(self.protected))
        if key not in _BEFORE:  # before the agent's first command; same for every container of the image
            _BEFORE[key] = self.sb.digests(self.protected)
        self.before = _BEFORE[key]

    async def offered(self) -> list[dict]:
        return TOOLS if self.s.tool_calling else []

    async def close(self) -> None:
        """What a mode holds open in the sandbox, ended before the episode settles (bash: nothing)."""

    def system_prompt(self, env: EnvSpec) -> str:
        return SYSTEM_PROMPT.format(workdir=env.workdir) + ("" if self.s.tool_calling else FENCED_HINT)

    async def run(self, turn: int, command: str) -> str:
        await self.started
        budget = min(self.s.command_timeout_s, max(1.0, self.st.deadline - time.monotonic()))
        res = await asyncio.to_thread(self.sb.exec, command, budget)
        self.st.steps.append(Step(turn=turn, command=command, exit_code=res.exit_code,
                                  duration_s=round(res.duration_s, 4), timed_out=res.timed_out,
                                  killed_by=res.killed_by, output_bytes=res.output_bytes, truncated=res.truncated))
        return _observation(res)

    def garbled(self, msg: Message) -> bool:
        """A reply with a lone surrogate (a JSON escape can carry one) can neither be stored in Parquet
        nor sent back: it is repaired in place (U+FFFD) and the turn is a format error, nothing run."""
        texts = [msg.content or ""] + [c.id + c.function.name + c.function.arguments for c in msg.tool_calls or []]
        if not any(SURROGATE.search(t) for t in texts):
            return False
        msg.content = SURROGATE.sub("\ufffd", msg.content) if msg.content else msg.content
        for c in msg.tool_calls or []:
            c.id, c.function.name, c.function.arguments = (SURROGATE.sub("\ufffd", t) for t in (
                c.id, c.function.name, c.function.arguments))
        self.st.format_errors += 1
        why = "format error: your reply contained invalid Unicode (a lone surrogate); nothing was run"
        self.st.messages += ([Message(role="tool", tool_call_id=c.id, name=c.function.name, content=why)
                              for c in msg.tool_calls] if msg.tool_calls else [Message(role="user", content=why)])
        return True

    async def answer(self, turn: int, name: str, args: dict | str) -> str:
        """Bash mode's answer to one call (`args`: the parsed arguments, or why they are not an object)."""
        if isinstance(args, str):
            self.st.format_errors += 1
            return f"format error: arguments are not valid JSON ({args})"
        if name != "bash" or not isinstance(args.get("command"), str) or not args["command"].strip():
            self.st.format_errors += 1
            return "format error: use bash with a non-empty `command`, or submit"
        self.st.format_errors = 0
        return await self.run(turn, args["command"])

    async def handle_tool_calls(self, turn: int, msg: Message,
                                answer: Callable[[int, str, dict | str], Awaitable[str]] | None = None) -> None:
        """Both modes' tool-call turns: arguments parsed once (`parse_arguments`), `submit` ends the turn,
        every other call is answered by the mode (`answer`: bash here, `ToolMode.answer` in tools mode)."""
        st = self.st
        if self.garbled(msg):
            return
        for call in msg.tool_calls:
            name = call.function.name
            args = parse_arguments(call.function.arguments)
            if name == "submit" and isinstance(args, dict):
                st.submitted = True
                st.messages.append(Message(role="tool", tool_call_id=call.id, name=name, content="submitted"))
                return
            text = await (answer or self.answer)(turn, name, args)
            st.messages.append(Message(role="tool", tool_call_id=call.id, name=name, content=text))

    async def handle_text(self, turn: int, msg: Message, cut: bool = False) -> None:
        st = self.st
        if self.garbled(msg):
            return
        text = msg.content or ""
        blocks = FENCE.findall(text)
        if blocks and blocks[0].strip():
            st.format_errors = 0
            obs = await self.run(turn, blocks[0].strip())
            st.messages.append(Message(role="user", content=f"Output:\n{obs}"))
        elif re.search(r"\bSUBMIT\b", text):
            st.submitted = True
        else:
            st.format_errors += 1
            why = "your reply hit the token limit before any command" if cut else "no command found"
            st.messages.append(Message(role="user", content=(
                f"format error: {why}. Call the bash tool (or put one short command in a ```bash block), "
                "or submit when done.")))

    async def finish(self) -> tuple[int, list[str], ChangeSet]:
        """Kill the agent's processes; return (how many were still running, protected paths changed,
        the change set against the image)."""
        await self.started
        leftover, after, changes = await asyncio.to_thread(self.sb.settle, self.protected)
        if after is None:  # the container's programs were changed: nothing was checksummed in it (toolchain_changed)
            return leftover, [], changes
        changed = sorted(p for p in set(self.before) | set(after) if self.before.get(p) != after.get(p))
        return leftover, changed, changes

    async def capture(self) -> bytes:
        return await asyncio.to_thread(self.sb.capture_work, self.s.final_state_limit)


# the turn loops an environment kind may name as its `agent_mode` (tasks/envs/kinds.py): (episode, env) -> mode
# (a mode may have `async close()`: run before the episode settles, and again, idempotent, if it fails)
MODES: dict[str, Callable[[_Episode, EnvSpec], Any]] = {
    "bash": lambda ep, env: ep,
    "mcp": lambda ep, env: ToolMode(ep, declared_tools(env.files) or recorded_tools(env), launch_of(env.files)),
}


async def _close(mode: Any) -> None:
    """End what a mode holds open in the sandbox (its optional `close()`; tools mode: the server session)."""
    close = getattr(mode, "close", None)
    if close is not None:
        await close()


class ConversationSlot(Protocol):
    """A place among the conversations the teacher is given at once; `release` is idempotent."""

    async def acquire(self) -> None: ...

    def release(self) -> None: ...


def _turn_protocol(env: EnvSpec, harness: str | None) -> tuple[str, Callable[[_Episode, EnvSpec], Any]]:
    """(label, mode factory) of `env` under `harness`: the kind's own turn loop (`MODES[kind.agent_mode]`) for its
    own harness (or None), else the registered harness's (tasks/agent/harnesses)."""
    from .harnesses import get, own

    if own(env, harness):
        kind = kind_of(env)
        return kind.harness, MODES[kind.agent_mode]
    h = get(harness)
    if env.kind not in h.kinds:
        raise ValueError(f"harness {h.name} does not drive {env.kind!r} environments (it drives {', '.join(h.kinds)})")
    return h.name, h.mode


class _Preview(_Episode):
    """An episode with no sandbox (`episode_start`): what a mode needs to say how an episode begins, nothing it
    needs to run one (`sb` is None: a mode that must ask its sandbox before the first turn cannot preview)."""

    def __init__(self, s: EpisodeSettings):  # not super().__init__: that starts a sandbox
        self.s, self.sb, self.protected, self.before = s, None, [], {}
        self.st = _State([], deadline=0.0)
        self.started = None


async def _start_of(env: EnvSpec, harness: str | None, s: EpisodeSettings) -> dict[str, Any]:
    label, make_mode = _turn_protocol(env, harness)
    mode = make_mode(_Preview(s), env)
    tools = await mode.offered()
    return {"harness": label, "tools": [t["function"]["name"] for t in tools],
            "messages": [{"role": "system", "content": mode.system_prompt(env)},
                         {"role": "user", "content": env.instruction}]}


def episode_start(env: EnvSpec, harness: str | None, s: EpisodeSettings) -> dict[str, Any]:
    """How an episode of `env` under `harness` begins, as `run_episode` begins it (the same mode, system prompt,
    instruction and tools), without a sandbox or a teacher: {harness, tools (names), messages}."""
    return asyncio.run(_start_of(env, harness, s))


async def run_episode(env: EnvSpec, session: TeacherSession, make_sandbox: Callable[[], Sandbox],
                      s: EpisodeSettings, teacher: str, sample: int, slot: ConversationSlot | None = None,
                      harness: str | None = None) -> Rollout:
    """Run one episode under `harness` (a registered name; None: the kind's own). Raises SandboxError on
    infrastructure failure (caller retries).

    `slot` bounds the conversations with the teacher: it is acquired once the container is starting
    (so a start overlaps other episodes' turns, not only this one's first) and released as soon as the
    episode asks the teacher nothing more, before the sandbox work that ends it (settle, capture,
    hidden tests, removal). `wall_s` counts from the slot on.

    Teacher time is not agent time. The episode budget (`env.agent_timeout_s` or
    `episode_timeout_s`) counts the agent's commands and, per turn, the model's generation at a
    healthy speed: min(the answering request's latency, completion tokens / `agent_tokens_per_s`).
    Everything else a turn takes (a queue at the in-flight cap, retries, backoff, Retry-After, a
    server slower than that speed) extends the deadline by as much: it is teacher time, bounded per
    turn by `teacher.max_wait_s` (the client's own bound, with a backstop here), and exceeding it ends
    the episode as `teacher_error`, never `agent_timeout`. A turn whose charged generation passes the
    deadline ends the episode as `agent_timeout` without its message (the overshoot is at most one
    turn's generation allowance, `max_tokens / agent_tokens_per_s`)."""
    t0 = time.monotonic()
    st = _State([], deadline=t0 + (env.agent_timeout_s or s.episode_timeout_s))
    tools: list[dict] = []
    teacher_turn_s = s.teacher_max_wait_s + s.max_tokens / s.agent_tokens_per_s + 30  # the longest a turn may take
    status, error = "max_turns", None
    label, make_mode = _turn_protocol(env, harness)
    sb = make_sandbox()
    ep = mode = None
    try:
        sb.toolchain_allowed = tuple(env.expected_changes)  # what the reference solution changes there too
        venue = named(s.venue)
        sb.fresh = venue.fresh_container
        ep = _Episode(sb, st, s, env.protected)
        if slot is not None:
            await slot.acquire()
            t0 = time.monotonic()
            st.deadline = t0 + (env.agent_timeout_s or s.episode_timeout_s)
        mode = make_mode(ep, env)
        turns = s.max_turns
        try:
            tools = await mode.offered()  # tools mode: the server's tools (waits for the first container of an image)
        except HarnessUnavailable as err:
            status, error, turns = "harness_unavailable", str(err)[:500], 0
        st.deadline += time.monotonic() - t0
        opening = getattr(mode, "opening", None)  # a mode that writes its own first messages (a scaffold's templates)
        st.messages += await opening(env) if opening is not None else [
            Message(role="system", content=mode.system_prompt(env)), Message(role="user", content=env.instruction)]
        for turn in range(1, turns + 1):
            remaining = st.deadline - time.monotonic()
            if remaining <= 0:
                status = "agent_timeout"
                break
            last_prompt = st.usage[-1].prompt_tokens + st.usage[-1].completion_tokens if st.usage else 0
            if s.context_budget and last_prompt + s.max_tokens > s.context_budget:
                status = "context_overflow"
                error = f"history of ~{last_prompt} tokens + max_tokens {s.max_tokens} exceeds the budget {s.context_budget}"
                break
            asked = time.monotonic()
            try:
                out = await asyncio.wait_for(session.next_turn(st.messages, tools), timeout=teacher_turn_s)
            except asyncio.TimeoutError:  # a backstop: the openai client bounds itself the same way
                status, error = "teacher_error", f"no answer within {teacher_turn_s:.0f}s (teacher.max_wait_s)"
                break
            except ContextOverflow as err:
                status, error = "context_overflow", str(err)[:500]
                break
            except TeacherError as err:
                status, error = "teacher_error", str(err)[:500]
                break
            took = time.monotonic() - asked
            st.deadline += took - min(took, out.latency_s, out.completion_tokens / s.agent_tokens_per_s)
            if time.monotonic() >= st.deadline:  # the model's own generation used up the budget
                status = "agent_timeout"
                break
            st.messages.append(out.message)
            st.usage.append(TurnUsage(turn=turn, prompt_tokens=out.prompt_tokens,
                                      completion_tokens=out.completion_tokens, latency_s=round(out.latency_s, 4),
                                      finish_reason=out.finish_reason, endpoint=out.endpoint,
                                      completion_token_ids=out.completion_token_ids, logprobs=out.logprobs,
                                      **st.prompt_delta(out.prompt_token_ids, out.completion_token_ids)))
            try:
                if out.message.tool_calls:
                    await mode.handle_tool_calls(turn, out.message)
                else:
                    await mode.handle_text(turn, out.message, cut=out.finish_reason == "length")
            except SandboxStopped:  # the agent's own processes stopped its container: the episode ends there
                break
            if st.ended is not None:
                status, error = st.ended
                break
            if st.submitted:
                status = "ok"
                break
            if st.format_errors >= MAX_CONSECUTIVE_FORMAT_ERRORS:
                status, error = "format_error", f"{st.format_errors} consecutive turns without a valid {mode.what}"
                break
            if time.monotonic() >= st.deadline:
                status = "agent_timeout"
                break
        if slot is not None:
            slot.release()
        await _close(mode)  # tools mode: the server session ends before anything is settled or read
        in_place, outside, odd, omitted = None, None, [], []
        try:
            leftover, changed, changes = await ep.finish()
        except FinalStateUnavailable as err:  # e.g. more files than the change walk lists: the model's doing
            leftover, changed, changes, captured = -1, [], None, err
        else:
            # what reproduces the change set elsewhere: the work dir, and the files added or modified
            # outside it (before any test runs: tests write files too)
            if sb.toolchain_changed:  # judged from outside only: no program of this container runs again
                captured = (await asyncio.gather(ep.capture(), return_exceptions=True))[0] \
                    if not sb.cfg.work_tmpfs_mb else None
            else:
                captured, outside = await asyncio.gather(
                    ep.capture(), asyncio.to_thread(capture_outside, sb, changes, env.workdir, s.final_state_limit,
                                                    lambda p: expected(p, env)),
                    return_exceptions=True)
        if sb.stopped:  # (found by a command or by the settle): a named outcome of the model's, judged on its files
            status, error = "agent_killed_sandbox", sb.stopped
        if isinstance(outside, BaseException):
            raise outside
        outside, omitted = outside if isinstance(outside, tuple) else (outside, [])
        if isinstance(captured, FinalStateUnavailable):  # the model filled its work dir or hid it: a failure, not retried
            final_state, error = None, f"{error + '; ' if error else ''}{captured}"
        elif isinstance(captured, BaseException):
            raise captured
        else:
            final_state = captured
        if final_state is not None and not sb.toolchain_changed:  # before any test writes a file
            odd = await asyncio.to_thread(odd_links, sb, final_state, outside, env.workdir,
                                          own_files(changes, env))
        # after the capture: tests may write files (a fresh venue with a tmpfs work dir was not reborn: the verify
        # stage tests it isolated)
        if venue.during_rollout and final_state is not None and not sb.toolchain_changed \
                and (not venue.fresh_container or sb.episode_container is not None):
            in_place = (await asyncio.to_thread(run_hidden_tests, sb, env, s.test_timeout_s,
                                                  env.tests_run_agent_code == "subprocess")).to_record()
            in_place.venue = "fresh" if sb.episode_container is not None else venue.name
    finally:
        if mode is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(_close(mode))
        if ep is not None and not ep.started.done():
            with contextlib.suppress(BaseException):  # a start still in flight: let it end, then remove it
                await asyncio.shield(ep.started)
        # shield: a cancelled episode (shard shutting down) must still remove its container
        await asyncio.shield(asyncio.to_thread(sb.close))
    return Rollout(
        rollout_id=rollout_id(env.env_id, teacher, sample, None if label == kind_of(env).harness else label),
        env_id=env.env_id, teacher=teacher, harness=label,
        sample=sample, messages=st.messages, tools_json=json.dumps(tools), steps=st.steps, usage=st.usage,
        prompt_tokens=sum(u.prompt_tokens for u in st.usage),
        completion_tokens=sum(u.completion_tokens for u in st.usage),
        turns=len(st.usage), tool_call_errors=st.call_errors, status=status, error=error, wall_s=round(time.monotonic() - t0, 3),
        protected_changed=changed, leftover_processes=leftover, final_state=final_state, in_place_tests=in_place,
        changes=changes, outside_state=outside, outside_omitted=omitted, toolchain_changed=sb.toolchain_changed,
        odd_links=odd)
