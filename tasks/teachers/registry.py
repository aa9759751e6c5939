"""Teacher backends, by name. A new backend is one module (its settings model, `make`, optionally a
`service`) plus one `register(...)` line: here for a built-in one, in the plugin module for others
(`plugins:` in the build config imports it in the driver and in every worker).

`teacher.backend` / `extra_teachers[i].backend` pick the settings model (`config_model`), the
teacher (`make_teacher`) and the service the build starts before the stages that need a teacher
(`teacher_service`). Nothing outside the backend's module branches on its name.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from ...schemas.config import TeacherConfig, register_teacher_settings
from .base import Teacher, TeacherBackend
from .openai import OpenAIBackend
from .replay import ReplayBackend
from .vllm import VLLMBackend

BACKENDS: dict[str, TeacherBackend] = {}


def register(backend: TeacherBackend) -> TeacherBackend:
    """Make `backend` available under `backend.name` (a second registration replaces the first); its
    settings model joins the records' table (`schemas.config.TEACHER_SETTINGS`), which validates
    teacher sections."""
    BACKENDS[backend.name] = backend
    register_teacher_settings(backend.name, backend.config)
    return backend


for _builtin in (ReplayBackend(), OpenAIBackend(), VLLMBackend()):
    register(_builtin)


def backend(name: str) -> TeacherBackend:
    try:
        return BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown teacher backend {name!r}; known: {', '.join(sorted(BACKENDS))} "
                         "(a plugin module listed in `plugins:` may register more)") from None


def config_model(name: str) -> type[TeacherConfig]:
    return backend(name).config


def make_teacher(cfg: TeacherConfig, runtime: dict[str, Any] | None = None, limiter: Any = None) -> Teacher:
    """`runtime` carries what the build started for this run (e.g. the vLLM server's endpoint)."""
    return backend(cfg.backend).make(cfg, dict(runtime or {}), limiter)


def teacher_launch(cfg: Any, ctx: Any, console: Any) -> Any:
    """The `teacher` service's early start (`TeacherBackend.launch`): a handle, or None for a backend with
    nothing slow to start."""
    return backend(cfg.teacher.backend).launch(cfg.teacher, ctx, console)


@contextlib.contextmanager
def teacher_service(cfg: Any, ctx: Any, console: Any, early: Any = None) -> Iterator[dict[str, Any]]:
    """The build's `teacher` service: whatever the configured teacher's backend starts (finishing the start
    `teacher_launch` began, when it returned a handle)."""
    kw = {"early": early} if early is not None else {}
    with backend(cfg.teacher.backend).service(cfg.teacher, ctx, console, **kw) as runtime:
        yield runtime


