"""Teachers: the protocol (`base`), the backend registry (`registry`), one module per backend
(`replay`, `openai`, `vllm`), endpoint routing (`endpoints`), the vLLM process (`vllm_server`) and
recorded-trajectory files (`recorded`). See `registry` for how a backend is added."""

from .base import ContextOverflow, Teacher, TeacherBackend, TeacherError, TeacherSession, Turn
from .registry import BACKENDS, backend, config_model, make_teacher, register, teacher_launch, teacher_service
from .replay import ReplayTeacher

__all__ = ["BACKENDS", "ContextOverflow", "ReplayTeacher", "Teacher", "TeacherBackend", "TeacherError",
           "TeacherSession", "Turn", "backend", "config_model", "make_teacher", "register", "teacher_launch",
           "teacher_service"]
