"""Services a build starts for the stages that declare them (`Stage.services` / `services_for`).

`teacher`: whatever the configured teacher's backend starts (`tasks.teachers`): the `vllm` backend
its own server, `openai` a health probe of the endpoints, `replay` nothing. It lives for the whole
build: entered before the first stage that declares it (its slow start begun earlier: below), stopped when the build ends, fails or is
interrupted. It is also one of the `EARLY` services: when a stage upstream of one that declares it
starts running shards (the environments are being made, so the stage that needs the teacher will run),
its slow start begins then (`teacher_launch`: the vLLM server's process) and the service waits for it
when its stage comes; a start that dies meanwhile fails the build at once, naming why, and one that goes
unused (its stage reused after all) is stopped when that stage is reused.

`sandboxes` (synthesize, rollout, verify): reap before, reap after, around each stage that declares
it. Before its shards: the containers of dead owners and every leftover of this build (a killed
run's) are removed, on this host and on the host of every worker of the flow's Dask scheduler; after
them, every container of this build (none outlives its stage). Only the holder of the build's lease
runs a build, so reaping by build id never touches another live driver's sandboxes.

What a service yields is merged into the stage context's `runtime` (never into a fingerprint).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from ..tasks.teachers import teacher_launch, teacher_service


@contextlib.contextmanager
def sandboxes_service(cfg: Any, ctx: Any, console: Any) -> Iterator[dict[str, Any]]:
    _reap(ctx, console, "from a dead run")
    try:
        yield {}
    finally:
        _reap(ctx, console, f"of build {ctx.build_id}")


def _reap(ctx: Any, console: Any, whose: str) -> None:
    """Dead owners' and this build's sandboxes on this host's engine and on every worker's host; never
    fails the stage."""
    from ..tasks.sandbox import reap_here
    from .runtime import flow_scheduler_address, reap_on_workers

    try:  # the engine the config names for this host (`sandbox.engine`, $TRAJFORGE_DOCKER_HOST)
        here = reap_here(ctx.build_id, ctx.config.sandbox.engine)
    except Exception:  # no engine on the driver's host: its workers may still have one
        here = 0
    if here:
        console.print(f"  removed {here} leftover sandbox container(s) {whose}")
    address = flow_scheduler_address()
    if address is None:  # a local cluster: its workers share this host's engine
        return
    try:
        on_workers = reap_on_workers(address, ctx.build_id, ctx.config.sandbox.engine)
    except Exception as err:
        console.print(f"[yellow]![/] could not reach the workers to reap sandboxes ({err.__class__.__name__})")
        return
    removed = sum(n for n in on_workers.values() if n > 0)
    if removed:
        console.print(f"  removed {removed} leftover sandbox container(s) {whose} on the workers' hosts")
    for w in (w for w, n in on_workers.items() if n < 0):
        console.print(f"[yellow]![/] worker {w} could not reach its Docker engine to reap sandboxes")


SERVICES = {"teacher": teacher_service, "sandboxes": sandboxes_service}
# services whose slow start can begin before their stage (a handle with `failed()` and `stop()`, or None), passed to
# the service as `early=` when its stage comes
EARLY = {"teacher": teacher_launch}
PER_STAGE = frozenset({"sandboxes"})
"""Services entered around each stage that declares them (its pending shards); the others live for the build."""
