"""Harness `mini-swe-agent`: the third-party scaffold mini-swe-agent (PyPI `mini-swe-agent`, 2.4.x) driven in
trajforge's sandbox through its own extension points, its own agent loop (`DefaultAgent`), prompts, parsing and
ending, so the trajectories are the ones that scaffold writes.

What is the scaffold's and what is trajforge's:
- **Config**: the package's own `config/default.yaml`, read from the installed package: its system and instance
  templates, its observation and format-error templates and its environment variables (PAGER=cat, ...). That
  config is text-based: a reply carries exactly one ```mswea_bash_command block, parsed with the package's
  `parse_regex_actions` and the regex of its `LitellmTextbasedModel`; no tools are offered (`tools_json` is
  `[]`). The episode ends when a command's output starts with `COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`
  (`echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`, checked by the package's `LocalEnvironment._check_finished`).
  (The `mini` command's `mini.yaml` uses a `bash` tool call instead; `default.yaml` is the package's default
  text-based scaffold, the one its SWE-bench numbers were first reported with.)
- **Model** (`_Model`, the package's `Model` protocol): `query(messages)` hands the scaffold's messages to the
  episode loop (tasks/agent/harness.py `run_episode`) and blocks until the teacher's reply comes back. The
  loop asks the episode's teacher session with exactly those messages, so every model call is one turn of
  the rollout, recorded like any harness's (`Rollout.usage`: tokens, latency, finish reason, prompt and
  completion token ids when the server returns them) and charged to the same budget. litellm is never
  imported: the call goes through trajforge's teacher client.
- **Environment** (`_Environment`, the package's `Environment` protocol): `execute(action)` runs the command in
  the episode's `Sandbox` as the bash harness does (the agent user, the work dir as cwd, a fresh bash per
  command, `command_timeout_s` capped by the episode deadline) with the config's variables, records it as a
  `Step`, and returns the scaffold's output dict (`returncode`, `output`, and `exception_info` for a killed
  command, in the words of its own environments).
- **The loop bridge**: the scaffold's `agent.run()` runs in a worker thread (it is synchronous); the episode
  loop stays the driver (budgets, teacher errors, usage, settle, capture, verifier unchanged). The mode's
  `opening(env)` starts the thread and returns the scaffold's first two messages (its templates rendered
  with the instruction as `task`); each `handle_text` gives the reply to the blocked `query`, and waits
  until the scaffold asks again (its observation or format-error message appended) or ends. The command runs
  on the event loop (`run_coroutine_threadsafe`) while the thread waits. Why the episode loop asks the teacher
  rather than the scaffold's thread: budgets, teacher errors and backoff, token-id recording and the agent's
  time accounting stay one code path for every harness; the scaffold still decides every prompt's content.
- **messages** are the scaffold's conversation as it sent it (its `extra` fields dropped, the teacher's reply
  messages as received). mini-swe-agent 2.x drops a reply it cannot parse from its history (only its
  format-error message follows): so does the trajectory, and the next prompt does not extend the previous
  prompt + completion: such a rollout is not prefix-preserving (`rl_tokens.prefix_preserving` is computed
  from the token ids and comes out False; train it per turn). A rollout without format errors is append-only
  plain user/assistant text, prefix-preserving like the bash harness's fenced mode.
- **Budgets**: its `step_limit` is `max_turns` (the episode loop stops at the same turn), its `cost_limit` and
  `wall_time_limit_seconds` are 0 (off: trajforge's deadline charges the agent's commands and generation, not
  the teacher's queue; a cost is not known for every teacher), `max_consecutive_format_errors` is trajforge's
  (3). When the episode loop stops first (agent_timeout, context_overflow, teacher_error), `close()` makes the
  blocked `query` raise the package's `LimitsExceeded` and joins the thread.
- **Outcomes**: `Submitted` -> ok; `RepeatedFormatError` -> format_error (the last reply quoted in `error`);
  `LimitsExceeded` -> max_turns; `TimeExceeded` -> agent_timeout; a sandbox failure raised inside the
  scaffold reaches the episode as itself (retried, or `agent_killed_sandbox`); any other exception of the
  scaffold -> infra_error naming it. Never a crash.
- **Replay** (`render`): each command of a reference solution becomes a reply in the scaffold's format (a
  THOUGHT line, then the ```mswea_bash_command block), and a last reply runs
  `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`. A command the block cannot carry (a line starting with three
  backticks would end it early) is sent base64-encoded and decoded into bash in the sandbox.

Packaging: an optional dependency (`pip install 'trajforge[mini-swe-agent]'`; `dev` includes it, so CI has it),
imported only when an episode of this harness starts; missing, `MiniSweAgentMissing` says how to install it.
Before the import, `MSWEA_SILENT_STARTUP` (no banner), `MSWEA_GLOBAL_CONFIG_DIR` (an empty trajforge folder
unless set: no user `.env` of mini-swe-agent is loaded into the process) and `LITELLM_LOCAL_MODEL_COST_MAP=True`
(litellm, should anything import it, reads its bundled cost map instead of fetching one) are set. Nothing of the
package opens a connection: the model calls are trajforge's, the commands run in the sandbox.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import platform
import queue
import re
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from ....schemas.environment import EnvSpec
from ....schemas.trajectory import Message, Step
from ...sandbox import SandboxError
from ...teachers.replay import TEXT
from ..harness import MAX_CONSECUTIVE_FORMAT_ERRORS
from ..mcp_relay import SURROGATE
from . import Call, Harness, register

NAME = "mini-swe-agent"
VERSION = "~=2.4.6"  # what pyproject.toml's extra asks for
# `LitellmTextbasedModelConfig.action_regex` (models/litellm_textbased_model.py, a module that imports litellm at
# its top, so it is not imported here; tests check the package still says this)
ACTION_REGEX = r"```mswea_bash_command\s*\n(.*?)\n```"
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
ENV_VARS = {"MSWEA_SILENT_STARTUP": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}


class MiniSweAgentMissing(ImportError):
    """mini-swe-agent is not installed (or not importable) in trajforge's environment."""


def load() -> dict[str, Any]:
    """The package's modules this harness uses, imported now (once; the variables above set first)."""
    os.environ.update(ENV_VARS)
    os.environ.setdefault("MSWEA_GLOBAL_CONFIG_DIR", str(Path(tempfile.gettempdir()) / "trajforge-mini-swe-agent"))
    try:
        import yaml
        from minisweagent import __version__
        from minisweagent.agents.default import DefaultAgent
        from minisweagent.config import builtin_config_dir
        from minisweagent.environments.local import LocalEnvironment
        from minisweagent.exceptions import FormatError, InterruptAgentFlow, LimitsExceeded
        from minisweagent.models.utils.actions_text import format_observation_messages, parse_regex_actions
    except ImportError as err:
        raise MiniSweAgentMissing(
            f"harness {NAME} needs the mini-swe-agent package ({err}): pip install 'trajforge[mini-swe-agent]' "
            f"(or pip install 'mini-swe-agent{VERSION}') in trajforge's environment") from err
    logging.getLogger("minisweagent").setLevel(logging.WARNING)  # its import sets DEBUG on a console handler
    return {"version": __version__, "DefaultAgent": DefaultAgent, "FormatError": FormatError,
            "InterruptAgentFlow": InterruptAgentFlow, "LimitsExceeded": LimitsExceeded,
            "check_finished": LocalEnvironment._check_finished, "parse": parse_regex_actions,
            "observe": format_observation_messages,
            "config": yaml.safe_load((Path(builtin_config_dir) / "default.yaml").read_text())}


class _Stop(Exception):
    """Handed to a blocked `query` when the episode loop stopped first."""


class _Model:
    """The package's `Model` protocol over the episode loop: `query` is one turn of the rollout."""

    def __init__(self, mode: "MiniSweAgentMode", config: dict[str, Any]):
        self.mode, self.config = mode, dict(config)
        self.config.setdefault("action_regex", ACTION_REGEX)
        self.config["model_name"] = "trajforge-teacher"

    def query(self, messages: list[dict], **kwargs: Any) -> dict:
        m = self.mode.pkg
        reply, finish_reason = self.mode.ask(messages)
        content = reply.content or ""
        try:
            actions = m["parse"](content, action_regex=self.config["action_regex"],
                                 format_error_template=self.config["format_error_template"],
                                 template_kwargs={"finish_reason": finish_reason})
        except m["FormatError"] as err:  # the package's contract: the response persisted with the error
            err.messages[0]["extra"].update({"cost": 0.0, "response": reply.model_dump(mode="json")})
            self.mode.last_bad = content
            raise
        message = {"role": "assistant", "content": content,
                   "extra": {"actions": actions, "cost": 0.0, "timestamp": time.time()}}
        # stored as received, but as the scaffold sends it back: its text (tool calls, offered none, are not read)
        self.mode.received[id(message)] = reply.model_copy(update={"tool_calls": None}) if reply.tool_calls else reply
        return message

    def format_message(self, **kwargs: Any) -> dict:
        return kwargs

    def format_observation_messages(self, message: dict, outputs: list[dict],
                                    template_vars: dict | None = None) -> list[dict]:
        return self.mode.pkg["observe"](outputs, observation_template=self.config["observation_template"],
                                        template_vars=template_vars)

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        return {**self.config, **kwargs}

    def serialize(self) -> dict:
        return {"info": {"config": {"model": self.config, "model_type": f"{__name__}._Model"}}}


class _Environment:
    """The package's `Environment` protocol over the episode's sandbox (called from the scaffold's thread)."""

    def __init__(self, mode: "MiniSweAgentMode", config: dict[str, Any]):
        self.mode = mode
        self.config = {"cwd": mode.workdir, "env": dict(config.get("env") or {}),
                       "timeout": mode.s.command_timeout_s}

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        command = action.get("command", "")
        res, budget = asyncio.run_coroutine_threadsafe(self.mode.run(command, self.config["env"]),
                                                       self.mode.loop).result()
        output: dict[str, Any] = {"output": res.output, "returncode": res.exit_code, "exception_info": ""}
        if res.killed_by:  # as the package's own environments word a command they killed
            why = (f"Command '{command}' timed out after {budget:g} seconds" if res.killed_by == "timeout"
                   else f"the command was killed ({res.killed_by})")
            output.update(returncode=-1, exception_info=f"An error occurred while executing the command: {why}",
                          extra={"exception_type": res.killed_by, "exception": why})
        self.mode.pkg["check_finished"](self, output)  # raises Submitted: the scaffold's own ending
        return output

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        # as its DockerEnvironment: the config and the host's uname (a container shares the host's kernel)
        return {**self.config, **platform.uname()._asdict(), **kwargs}

    def serialize(self) -> dict:
        return {"info": {"config": {"environment": self.config, "environment_type": f"{__name__}._Environment"}}}


class MiniSweAgentMode:
    """One episode's scaffold: its agent in a worker thread, bridged to the episode loop (module docstring)."""

    what = "```mswea_bash_command block"

    def __init__(self, ep: Any, env: EnvSpec):
        self.pkg = load()
        self.ep, self.st, self.s, self.workdir, self.task = ep, ep.st, ep.s, env.workdir, env.instruction
        cfg = self.pkg["config"]
        agent_cfg = {**cfg["agent"], "step_limit": self.s.max_turns, "cost_limit": 0.0,
                     "wall_time_limit_seconds": 0, "max_consecutive_format_errors": MAX_CONSECUTIVE_FORMAT_ERRORS,
                     "output_path": None}
        agent_cfg.pop("mode", None)
        self.agent = self.pkg["DefaultAgent"](_Model(self, cfg["model"]), _Environment(self, cfg.get("environment", {})),
                                              **agent_cfg)
        self.received: dict[int, Message] = {}  # id of the scaffold's assistant dict -> the teacher's message
        self.replies: queue.Queue = queue.Queue()
        self.turn = 0
        self.last_bad = ""
        self.loop: asyncio.AbstractEventLoop | None = None
        self.event: asyncio.Future | None = None
        self.thread: threading.Thread | None = None
        self.finished = False  # the scaffold's run returned (or raised): its thread ends by itself

    # -- the scaffold's thread ------------------------------------------------------------------------
    def _post(self, event: tuple[str, Any]) -> None:
        def deliver() -> None:
            if self.event is not None and not self.event.done():
                self.event.set_result(event)
        self.loop.call_soon_threadsafe(deliver)

    def ask(self, messages: list[dict]) -> tuple[Message, str]:
        """(thread) The scaffold's request: posted to the episode loop; blocks until its reply comes."""
        self._post(("query", messages))
        item = self.replies.get()
        if isinstance(item, _Stop):
            raise self.pkg["LimitsExceeded"]({"role": "exit", "content": "trajforge stopped the episode",
                                              "extra": {"exit_status": "EpisodeEnded", "submission": ""}})
        return item

    def _work(self) -> None:
        try:
            self.agent.run(task=self.task)
            self._post(("done", None))
        except BaseException as err:  # noqa: BLE001  (handed to the episode loop, which names it)
            self._post(("done", err))

    async def run(self, command: str, env: dict[str, str]) -> tuple[Any, float]:
        """(event loop) One command in the sandbox, as the bash harness runs it; recorded as a step."""
        ep, st = self.ep, self.st
        await ep.started
        budget = min(self.s.command_timeout_s, max(1.0, st.deadline - time.monotonic()))
        res = await asyncio.to_thread(ep.sb.exec, command, budget, env=env)
        st.steps.append(Step(turn=self.turn, command=command, exit_code=res.exit_code,
                             duration_s=round(res.duration_s, 4), timed_out=res.timed_out, killed_by=res.killed_by,
                             output_bytes=res.output_bytes, truncated=res.truncated))
        return res, budget

    # -- the episode loop's side ----------------------------------------------------------------------
    async def _hand(self, item: Any) -> tuple[str, Any]:
        self.event = self.loop.create_future()
        if item is None:
            self.thread = threading.Thread(target=self._work, name=f"{NAME}-agent", daemon=True)
            self.thread.start()
        else:
            self.replies.put(item)
        return await self.event

    def _conversation(self, messages: list[dict]) -> list[Message]:
        out = []
        for m in messages:
            if m.get("role") == "exit":
                continue
            if m.get("role") == "assistant" and id(m) in self.received:
                out.append(self.received[id(m)])
            else:
                out.append(Message(role=m["role"], content=m.get("content")))
        return out

    async def offered(self) -> list[dict]:
        return []  # text-based: the reply's ```mswea_bash_command block is the action

    def system_prompt(self, env: EnvSpec) -> str:
        return self.agent._render_template(self.agent.config.system_template)

    async def opening(self, env: EnvSpec) -> list[Message]:
        self.loop = asyncio.get_running_loop()
        kind, value = await self._hand(None)
        if kind != "query":
            raise RuntimeError(f"{NAME} ended before its first model call: {value!r}")
        return self._conversation(value)

    async def handle_text(self, turn: int, msg: Message, cut: bool = False) -> None:
        self.turn = turn
        if msg.content and SURROGATE.search(msg.content):  # neither storable nor sendable: repaired (U+FFFD)
            msg.content = SURROGATE.sub("\ufffd", msg.content)
        kind, value = await self._hand((msg, "length" if cut else "stop"))
        self._settle(kind, value)

    async def handle_tool_calls(self, turn: int, msg: Message) -> None:
        await self.handle_text(turn, msg)  # no tools offered: the scaffold reads the text (a format error)

    def _settle(self, kind: str, value: Any) -> None:
        st, agent = self.st, self.agent
        st.messages[:] = self._conversation(agent.messages)
        st.format_errors = agent.n_consecutive_format_errors
        if kind == "query":
            return
        self.finished = True
        if isinstance(value, SandboxError):  # infrastructure (retried) or the agent stopping its container
            raise value
        last = agent.messages[-1] if agent.messages else {}
        status = (last.get("extra") or {}).get("exit_status") if last.get("role") == "exit" else None
        if value is not None:
            st.ended = ("infra_error", f"{NAME} raised {type(value).__name__}: {value}"[:500])
        elif status == "Submitted":
            st.submitted = True
        elif status == "RepeatedFormatError":
            st.format_errors = max(st.format_errors, MAX_CONSECUTIVE_FORMAT_ERRORS)
            st.ended = ("format_error", f"{st.format_errors} consecutive replies without exactly one {self.what} "
                                        f"({NAME}: RepeatedFormatError); the last: {self.last_bad[:400]!r}")
        elif status == "TimeExceeded":
            st.ended = ("agent_timeout", f"{NAME}: TimeExceeded")
        elif status == "LimitsExceeded":
            st.ended = ("max_turns", None)
        else:
            st.ended = ("infra_error", f"{NAME} ended with exit status {status!r}")

    async def close(self) -> None:
        """Stop a scaffold still waiting for a reply (the episode loop ended first) and join its thread (idempotent)."""
        if self.thread is None:
            return
        if not self.finished and self.thread.is_alive():
            self.event = self.loop.create_future()
            self.replies.put(_Stop())
            try:
                await asyncio.wait_for(asyncio.shield(self.event), timeout=30)
            except asyncio.TimeoutError:
                pass  # a daemon thread: it never holds the process
            self.finished = True
            self.st.messages[:] = self._conversation(self.agent.messages)
        await asyncio.to_thread(self.thread.join, 30)


# -- replay rendering ---------------------------------------------------------------------------------
FENCE_BREAK = re.compile(r"(?m)^```")
CHUNK = 96 << 10


def reply(command: str, thought: str) -> str:
    """A reply in the scaffold's format: a THOUGHT line, then the command in its one fenced block."""
    if FENCE_BREAK.search(command):  # the block would end early: the same command, carried base64-encoded
        blob = base64.b64encode(command.encode()).decode()  # in argv strings of at most 96 KiB (Linux: 128 KiB each)
        command = f"printf %s {' '.join(blob[i:i + CHUNK] for i in range(0, len(blob), CHUNK))} | base64 -d | bash"
    return f"THOUGHT: {thought}\n\n```mswea_bash_command\n{command}\n```"


def render(env: EnvSpec, commands: list[str]) -> list[Call]:
    """The replay's replies: one per non-empty command, then the scaffold's submit command (text replies, the
    replay teacher's `("", {"content": ...})` calls)."""
    steps = [c for c in commands if c.strip()]
    out: list[Call] = [(TEXT, {"content": reply(c, f"Step {i} of {len(steps)} of the reference solution.")})
                       for i, c in enumerate(steps, 1)]
    return out + [(TEXT, {"content": reply(SUBMIT, "The task is done; submitting.")})]


HARNESS = register(Harness(name=NAME, kinds=("terminal",), mode=MiniSweAgentMode, render=render,
                           description="mini-swe-agent 2.4 (its DefaultAgent + default.yaml, text-based "
                                       "```mswea_bash_command blocks), driven in the sandbox"))
