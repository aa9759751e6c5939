"""A toy teacher that samples: every episode echoes a word it draws at random, then submits. Two runs of
the same episode never write the same rows (what a model teacher with temperature > 0 does). Listed in a
build config's `plugins:`, it is imported in the driver and in every Dask worker."""

from __future__ import annotations

import json
import secrets
from typing import Any, Literal

from trajforge.schemas.config import TeacherConfig
from trajforge.schemas.trajectory import FunctionCall, Message, ToolCall
from trajforge.tasks.teachers import register
from trajforge.tasks.teachers.base import ConfiguredTeacher, TeacherBackend, Turn


class SamplingConfig(TeacherConfig):
    backend: Literal["sampling"]

    @property
    def label(self) -> str:
        return self.name or "sampling"


class _Session:
    def __init__(self):
        self.word, self.turn = f"w{secrets.token_hex(6)}", 0

    async def next_turn(self, messages: list[Message], tools: list[dict[str, Any]]) -> Turn:
        self.turn += 1
        name, args = ("bash", {"command": f"echo {self.word}"}) if self.turn == 1 else ("submit", {})
        call = ToolCall(id=f"call_{self.turn}", function=FunctionCall(name=name, arguments=json.dumps(args)))
        return Turn(Message(role="assistant", content=None, tool_calls=[call]), completion_tokens=3,
                    finish_reason="tool_calls")


class SamplingTeacher(ConfiguredTeacher):
    def session(self, env, sample: int, rollout_id: str = "") -> _Session:
        return _Session()


class SamplingBackend(TeacherBackend):
    name = "sampling"
    config = SamplingConfig
    teacher = SamplingTeacher


register(SamplingBackend())
