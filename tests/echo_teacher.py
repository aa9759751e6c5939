"""A toy teacher backend, registered from outside trajforge (the way a team adds its own): it runs one
`echo <text>` command, then submits. Listed in a build config's `plugins:`, it is imported in the
driver and in every Dask worker."""

from __future__ import annotations

import json
from typing import Any, Literal

from trajforge.schemas.config import TeacherConfig
from trajforge.schemas.trajectory import FunctionCall, Message, ToolCall
from trajforge.tasks.teachers import register
from trajforge.tasks.teachers.base import ConfiguredTeacher, TeacherBackend, Turn


class EchoConfig(TeacherConfig):
    backend: Literal["echo"]
    text: str = "hello"

    @property
    def label(self) -> str:
        return self.name or f"echo:{self.text}"


class _Session:
    def __init__(self, text: str):
        self.text, self.turn = text, 0

    async def next_turn(self, messages: list[Message], tools: list[dict[str, Any]]) -> Turn:
        self.turn += 1
        name, args = ("bash", {"command": f"echo {self.text}"}) if self.turn == 1 else ("submit", {})
        call = ToolCall(id=f"call_{self.turn}", function=FunctionCall(name=name, arguments=json.dumps(args)))
        return Turn(Message(role="assistant", content=None, tool_calls=[call]), completion_tokens=3,
                    finish_reason="tool_calls")


class EchoTeacher(ConfiguredTeacher):
    def session(self, env, sample: int, rollout_id: str = "") -> _Session:
        return _Session(self.cfg.text)


class EchoBackend(TeacherBackend):
    name = "echo"
    config = EchoConfig
    teacher = EchoTeacher


register(EchoBackend())
