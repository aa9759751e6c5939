"""A test teacher backend (a plugin, like echo_teacher): replays each environment's reference solution,
but while `down_file` exists it dies after the first turn of the episodes it is told to fail
(`down_samples` of the `down_families`, all families when empty), raising TeacherError as a teacher
behind a dead server does. Every session it starts is one line in `log_file` (episodes actually run,
counted across Dask workers)."""

from __future__ import annotations

import os
from typing import Any, ClassVar, Literal

from pydantic import Field

from trajforge.schemas.config import TeacherConfig, operational
from trajforge.schemas.trajectory import Message
from trajforge.tasks.teachers import register
from trajforge.tasks.teachers.base import ConfiguredTeacher, TeacherBackend, TeacherError, Turn
from trajforge.tasks.teachers.replay import _ReplaySession


class FlakyConfig(TeacherConfig):
    generates_text: ClassVar[bool] = False

    backend: Literal["flaky"]
    down_file: str = operational("", description="while this file exists, the teacher fails the episodes below")
    log_file: str = operational("", description="one line per session started")
    down_samples: list[int] = Field(default_factory=lambda: [1])
    down_families: list[str] = Field(default_factory=list)


class _Session:
    def __init__(self, inner: _ReplaySession, doomed: bool, label: str):
        self.inner, self.doomed, self.label, self.turns = inner, doomed, label, 0

    async def next_turn(self, messages: list[Message], tools: list[dict[str, Any]]) -> Turn:
        self.turns += 1
        if self.doomed and self.turns > 1:
            raise TeacherError(f"teacher {self.label} is down: connection refused")
        return await self.inner.next_turn(messages, tools)


class FlakyTeacher(ConfiguredTeacher):
    def session(self, env, sample: int, rollout_id: str = "") -> _Session:
        cfg = self.cfg
        if cfg.log_file:
            with open(cfg.log_file, "a") as f:
                f.write(f"{env.env_id} {sample} {os.getpid()}\n")
        doomed = (bool(cfg.down_file) and os.path.exists(cfg.down_file) and sample in cfg.down_samples
                  and (not cfg.down_families or env.family in cfg.down_families))
        return _Session(_ReplaySession(list(env.solution)), doomed, self.label)


class FlakyBackend(TeacherBackend):
    name = "flaky"
    config = FlakyConfig
    teacher = FlakyTeacher


register(FlakyBackend())
