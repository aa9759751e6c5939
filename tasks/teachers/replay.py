"""Backend `replay`: executes recorded commands, with no model.

`replay.source: solution` replays each environment's reference solution; a JSONL or Parquet file of
recorded trajectories (env_id + `commands` or OpenAI `messages`, see `recorded`) replays the k-th
recorded trajectory of that environment for sample k (cycling when fewer were recorded). A file
source counts in the fingerprint by its content. From `messages`, a `tools` environment replays every
tool call (`Recorded.tool_commands`), a terminal one its `bash` calls only.

In a `tools` environment each command that is a tool call (`server.py call NAME 'ARGS'`, the oracle's
form, see tasks/envs/tools/spec.py) is replayed as that tool call (a ```json block in fenced mode);
any other command is replayed as a `bash` call, which such an environment refuses as an unknown tool.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Literal

import fsspec
from pydantic import Field

from ...schemas.config import Section, TeacherConfig
from ...schemas.environment import EnvSpec
from ...schemas.trajectory import FunctionCall, Message, ToolCall
from ..envs.kinds import of as kind_of
from .base import ConfiguredTeacher, TeacherBackend, Turn

TEXT = ""  # a rendered call with no tool name: a text reply (`_ReplaySession.render_with`)


class ReplayConfig(Section):
    """`solution`: each environment's reference solution. Otherwise a JSONL or Parquet file of
    recorded trajectories (env_id + `commands` or OpenAI `messages`)."""

    source: str = "solution"


class ReplayTeacherConfig(TeacherConfig):
    """A teacher that writes no text: it replays commands (`replay.source`)."""

    backend: Literal["replay"]
    replay: ReplayConfig = Field(default_factory=ReplayConfig)

    generates_text: ClassVar[bool] = False

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        return "replay" if self.replay.source == "solution" else f"replay:{Path(self.replay.source).name}"

    @property
    def card_model(self) -> str | None:
        return self.model or "reference solution (replay)"

    def fingerprint(self) -> dict[str, Any]:
        view = super().fingerprint()
        if self.replay.source != "solution":
            with fsspec.open(self.replay.source, "rb") as f:
                view["replay"]["sha256"] = hashlib.sha256(f.read()).hexdigest()[:16]
        return view


@dataclass
class _ReplaySession:
    commands: list[str]
    i: int = field(default=0)
    # how the environment's kind replays a command as a tool call (its `replay_call`; None: as `bash`)
    replay_call: Callable[[str], tuple[str, dict[str, Any]] | None] | None = None
    # the calls the episode's harness rendered the commands into (`render_with`; None: one per command, as above)
    calls: list[tuple[str, dict[str, Any]]] | None = None

    @property
    def tools_env(self) -> bool:
        return self.replay_call is not None

    def render_with(self, render: Callable[[list[str]], list[tuple[str, dict[str, Any]]]]) -> None:
        """The harness's rendering of the whole command list (`teachers.base.Replaying`): replayed call by call,
        a `bash` call as a ```bash block in fenced mode and any other as a ```json {"tool", "arguments"} block; a
        call with no tool name (`TEXT`, {"content": text}) is a reply of that text as it is, in either mode (a
        text-based scaffold's own reply format)."""
        self.calls = render(self.commands)

    def _call(self, command: str) -> tuple[str, dict[str, Any]]:
        parsed = self.replay_call(command) if self.replay_call else None
        return parsed or ("bash", {"command": command})

    def _fenced(self) -> str:
        if self.calls is not None:
            if self.i >= len(self.calls):
                return "SUBMIT"
            name, args = self.calls[self.i]
            if name == TEXT:
                return args["content"]
            return (f"```bash\n{args['command']}\n```" if name == "bash"
                    else f"```json\n{json.dumps({'tool': name, 'arguments': args})}\n```")
        if self.i >= len(self.commands):
            return "SUBMIT"
        name, args = self._call(self.commands[self.i])
        return (f"```json\n{json.dumps({'tool': name, 'arguments': args})}\n```" if self.tools_env
                else f"```bash\n{self.commands[self.i]}\n```")

    async def next_turn(self, messages: list[Message], tools: list[dict[str, Any]]) -> Turn:
        if not tools:  # fenced mode: answer in the format a model without tool calling must use
            text = self._fenced()
            self.i += 1
            return Turn(Message(role="assistant", content=text), finish_reason="stop")
        if self.calls is not None:
            name, args = self.calls[self.i] if self.i < len(self.calls) else ("submit", {})
            if name == TEXT:
                self.i += 1
                return Turn(Message(role="assistant", content=args["content"]), finish_reason="stop")
        elif self.i < len(self.commands):
            name, args = self._call(self.commands[self.i])
        else:
            name, args = "submit", {}
        call = ToolCall(id=f"call_{self.i}", function=FunctionCall(name=name, arguments=json.dumps(args)))
        self.i += 1
        return Turn(Message(role="assistant", content=None, tool_calls=[call]), finish_reason="tool_calls")


class ReplayTeacher(ConfiguredTeacher):
    """Replays recorded commands: each environment's reference solution, or the k-th recorded
    trajectory of that environment for sample k (cycling when fewer were recorded)."""

    def __init__(self, cfg: ReplayTeacherConfig, recorded: dict[str, list[list[str]]] | None = None,
                 recorded_tools: dict[str, list[list[str]]] | None = None):
        super().__init__(cfg)
        self.recorded = recorded
        self.recorded_tools = recorded_tools or recorded  # what `tools` environments replay
        if recorded is None and cfg.replay.source != "solution":
            from .recorded import load_recorded

            records, rejects = load_recorded(cfg.replay.source)
            if not records:
                raise ValueError(f"teacher.replay.source {cfg.replay.source}: no usable trajectory"
                                 + (f" ({rejects[0].reason}: {rejects[0].detail})" if rejects else ""))
            self.recorded, self.recorded_tools = {}, {}
            for r in records:
                self.recorded.setdefault(r.env_id, []).append(r.commands)
                self.recorded_tools.setdefault(r.env_id, []).append(
                    r.commands if r.tool_commands is None else r.tool_commands)

    def session(self, env: EnvSpec, sample: int, rollout_id: str = "") -> _ReplaySession:
        replay_call = kind_of(env).replay_call
        if self.recorded is None:
            return _ReplaySession(list(env.solution), replay_call=replay_call)
        runs = (self.recorded_tools if replay_call else self.recorded).get(env.env_id) or [[]]
        return _ReplaySession(list(runs[sample % len(runs)]), replay_call=replay_call)


class ReplayBackend(TeacherBackend):
    name = "replay"
    config = ReplayTeacherConfig
    teacher = ReplayTeacher
