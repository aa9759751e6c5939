"""Long-lived services a build starts before the stages that declare them (`Stage.services`).

`teacher`: whatever the configured teacher's backend starts (`tasks.teachers`): the `vllm` backend
its own server, `openai` a health probe of the endpoints, `replay` nothing. What a service yields is
merged into the stage context's `runtime` (never into a fingerprint); it is stopped when the build
ends, fails or is interrupted.
"""

from __future__ import annotations

from ..tasks.teachers import teacher_service

SERVICES = {"teacher": teacher_service}
