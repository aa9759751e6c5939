"""The one teacher API and what every backend implements.

A `Teacher` gives, per episode, a session whose `next_turn(messages, tools)` returns the assistant's
next message exactly as produced, with token usage (and token ids / logprobs when the server returns
them). A teacher that cannot answer raises TeacherError after bounded retries; the episode then ends
as `teacher_error`: infrastructure, never the model failing the task.

A `TeacherBackend` is one module: its settings model (a `TeacherConfig` subclass), how it makes a
`Teacher`, and the long-lived service a build starts for it (default: none). It is registered by name
in `trajforge.tasks.teachers`; nothing else branches on the backend.
"""

from __future__ import annotations

import contextlib
import hashlib
from abc import ABC
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Iterator, Literal, Protocol, runtime_checkable

from ...schemas.config import TeacherConfig
from ...schemas.environment import EnvSpec
from ...schemas.trajectory import Message


def stable_hash(text: str) -> int:
    """A 64-bit hash that is the same in every process (per-request seeds, rendezvous routing)."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


class TeacherError(RuntimeError):
    """The teacher could not answer (down, 5xx after retries, timeout)."""


class ContextOverflow(TeacherError):
    """The conversation no longer fits the model's context window (the model's outcome)."""


@dataclass
class Turn:
    """One answer. `latency_s` is the answering request's own time (the model's generation, plus
    prefill and any queue inside the server); `wait_s` is the teacher time before it (waiting for a
    slot at the in-flight cap, failed attempts, backoff, Retry-After): never the agent's time."""

    message: Message
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    wait_s: float = 0.0
    finish_reason: str | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    endpoint: str | None = None
    prompt_token_ids: list[int] | None = None  # the whole prompt as the server tokenised it (vLLM)


class TeacherSession(Protocol):
    async def next_turn(self, messages: list[Message], tools: list[dict[str, Any]]) -> Turn: ...


@runtime_checkable
class Replaying(Protocol):
    """A session that replays recorded commands (the replay teacher's): the episode's harness may say how
    the whole list becomes its tool calls, [(tool, arguments)] (tasks/agent/harnesses `Harness.render`),
    before the first turn."""

    def render_with(self, render: Callable[[list[str]], list[tuple[str, dict[str, Any]]]]) -> None: ...


class Teacher(Protocol):
    label: str

    def session(self, env: EnvSpec, sample: int, rollout_id: str) -> TeacherSession: ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True)
class Readiness:
    """One finding of `trajforge doctor` about a configured teacher: `fail` (a build could not use it),
    `warn` (it works, slower than it could) or `ok`, what was found and a one-line fix. `aspect`: empty
    for whether the teacher can answer at all, else what else was looked at (`setup`)."""

    status: Literal["ok", "warn", "fail"]
    detail: str
    fix: str = ""
    aspect: str = ""


class ConfiguredTeacher:
    """A teacher that holds only its settings (`cfg`, `label`) and has nothing to close; subclasses
    implement `session`."""

    def __init__(self, cfg: TeacherConfig):
        self.cfg, self.label = cfg, cfg.label

    async def aclose(self) -> None:
        return None


class TeacherBackend(ABC):
    """One teacher backend. `config` is its settings model; `make` builds a Teacher for one shard
    driver (event loop); `service` is what the build starts before the stages that need a teacher
    (it yields what goes into the stage context's `runtime`, e.g. endpoints)."""

    name: ClassVar[str]
    config: ClassVar[type[TeacherConfig]]
    teacher: ClassVar[Callable[[Any], Teacher] | None] = None

    def make(self, cfg: Any, runtime: dict[str, Any], limiter: Any = None) -> Teacher:
        """A teacher for `cfg`; `runtime` carries what the build's service started (never fingerprinted),
        `limiter` a cross-process limit on concurrent requests (see engine.contract.LimiterFactory).
        Default: `teacher(cfg)`, for a backend whose teacher needs neither."""
        if self.teacher is None:
            raise NotImplementedError(f"teacher backend {self.name!r}: set `teacher` or override `make`")
        return self.teacher(cfg)

    def launch(self, cfg: Any, ctx: Any, console: Any) -> Any:
        """Begin a slow start of the service without waiting for it (the build calls this while the stages before
        the first that needs a teacher run), returning a handle with `failed() -> str | None` (why it died
        already) and `stop()`; the build then enters `service(cfg, ctx, console, early=handle)`. Default: None
        (nothing worth starting early; `service` is then called without `early`)."""
        return None

    @contextlib.contextmanager
    def service(self, cfg: Any, ctx: Any, console: Any) -> Iterator[dict[str, Any]]:
        """Start what the backend needs for a build and stop it after; default: nothing."""
        yield {}

    def readiness(self, cfg: Any) -> list[Readiness]:
        """Whether this machine can serve `cfg` (`trajforge doctor`). Default: the endpoints it names
        answer `GET /models`, or nothing to check."""
        endpoints = list(getattr(cfg, "all_endpoints", lambda: [])())
        if not endpoints:
            return [Readiness("ok", f"backend {cfg.backend}: no server needed")]
        from .openai import probe

        bad = [(u, why) for u in endpoints if (why := probe(u, timeout=5)) is not None]
        if bad:
            return [Readiness("fail", f"{bad[0][0]}: {bad[0][1]}" + (f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""),
                              "start the server or fix teacher.endpoints / base_url")]
        return [Readiness("ok", f"{len(endpoints)} endpoint(s) answer GET /models")]
