"""The one teacher API: `make_teacher(cfg, runtime)` -> a Teacher whose `session(env, sample, rid)`
gives an object with `next_turn(messages, tools)` returning the assistant's next message exactly as
produced, with token usage (and token ids / logprobs when the server returns them).

Backends: `replay` (executes recorded commands: the reference solution, or trajectories from a
JSONL/Parquet file), `openai` (any OpenAI-compatible endpoints) and `vllm` (the same client, against
the server the build started: see `vllm_server`). A teacher that cannot answer raises TeacherError
after bounded retries; the episode then ends as `teacher_error`: infrastructure, never the model
failing the task.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..schemas.config import TeacherConfig
from ..schemas.environment import EnvSpec
from ..schemas.trajectory import FunctionCall, Message, ToolCall


class TeacherError(RuntimeError):
    """The teacher could not answer (down, 5xx after retries, timeout)."""


class ContextOverflow(TeacherError):
    """The conversation no longer fits the model's context window (the model's outcome)."""


@dataclass
class Turn:
    message: Message
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    finish_reason: str | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    endpoint: str | None = None


class TeacherSession(Protocol):
    async def next_turn(self, messages: list[Message], tools: list[dict[str, Any]]) -> Turn: ...


class Teacher(Protocol):
    label: str

    def session(self, env: EnvSpec, sample: int, rollout_id: str) -> TeacherSession: ...

    async def aclose(self) -> None: ...


# ---------------------------------------------------------------------------------------------
@dataclass
class _ReplaySession:
    commands: list[str]
    i: int = field(default=0)

    async def next_turn(self, messages: list[Message], tools: list[dict[str, Any]]) -> Turn:
        if not tools:  # fenced-bash mode: answer in the format a model without tool calling must use
            text = f"```bash\n{self.commands[self.i]}\n```" if self.i < len(self.commands) else "SUBMIT"
            self.i += 1
            return Turn(Message(role="assistant", content=text), finish_reason="stop")
        if self.i < len(self.commands):
            name, args = "bash", {"command": self.commands[self.i]}
        else:
            name, args = "submit", {}
        call = ToolCall(id=f"call_{self.i}", function=FunctionCall(name=name, arguments=json.dumps(args)))
        self.i += 1
        return Turn(Message(role="assistant", content=None, tool_calls=[call]), finish_reason="tool_calls")


class ReplayTeacher:
    """Replays recorded commands: each environment's reference solution, or the k-th recorded
    trajectory of that environment for sample k (cycling when fewer were recorded)."""

    def __init__(self, cfg: TeacherConfig, recorded: dict[str, list[list[str]]] | None = None):
        self.label = cfg.label
        self.recorded = recorded
        if recorded is None and cfg.replay.source != "solution":
            from .recorded import load_recorded

            records, rejects = load_recorded(cfg.replay.source)
            if not records:
                raise ValueError(f"teacher.replay.source {cfg.replay.source}: no usable trajectory"
                                 + (f" ({rejects[0].reason}: {rejects[0].detail})" if rejects else ""))
            self.recorded = {}
            for r in records:
                self.recorded.setdefault(r.env_id, []).append(r.commands)

    def session(self, env: EnvSpec, sample: int, rollout_id: str = "") -> _ReplaySession:
        if self.recorded is None:
            return _ReplaySession(list(env.solution))
        runs = self.recorded.get(env.env_id) or [[]]
        return _ReplaySession(list(runs[sample % len(runs)]))

    async def aclose(self) -> None:
        return None


def make_teacher(cfg: TeacherConfig, runtime: dict[str, Any] | None = None) -> Teacher:
    """`runtime` carries what the build started for this run (e.g. the vLLM server's endpoint)."""
    if cfg.backend == "replay":
        return ReplayTeacher(cfg)
    from .openai_teacher import OpenAITeacher

    if cfg.backend == "openai":
        return OpenAITeacher(cfg, cfg.all_endpoints())
    endpoints = (runtime or {}).get("teacher_endpoints") or cfg.all_endpoints()
    if not endpoints:
        raise TeacherError("backend 'vllm' has no running server: the build starts it before the rollout "
                           "stage (flows.build.teacher_service); none was passed to this stage")
    return OpenAITeacher(cfg, endpoints)
