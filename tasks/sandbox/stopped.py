"""Whose doing it is when an episode's container stops by itself.

A container runs docker's init with trajforge's `sleep infinity` as its only child; the init exits when that child
does. A root agent can end it (`pkill sleep`, `kill -9 -1`): the container stops, and every later exec fails. That
is the model's doing, not the infrastructure's, when the engine was asked for no kill, stop, restart or pause of the
container since it started and no out-of-memory kill happened in it (the engine's own record, read from outside:
its state and its event log). Anything else (the engine or the host stopped it, it was removed, the engine cannot
say) stays infrastructure.

Invariant: `stopped_by_agent` only reads; it never starts, stops or changes a container.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import docker.errors

if TYPE_CHECKING:
    from .container import Sandbox

# engine events that mean someone outside the container stopped it, or the kernel did (out of memory)
OUTSIDE_STOPS = ["kill", "stop", "restart", "pause", "oom"]


def stopped_by_agent(sb: "Sandbox") -> str | None:
    """Why `sb`'s container is no longer running, when its own processes ended it; None when it is running, is
    gone, or stopped by the engine's, the host's or the kernel's doing (see module docstring)."""
    api = sb.client.api
    try:
        state = api.inspect_container(sb.container.id)["State"]
        if state.get("Running") or state.get("Restarting") or state.get("OOMKilled"):
            return None
        asked = list(api.events(since=f"{sb.started_at - 1:.9f}", until=f"{time.time():.9f}", decode=True,
                                filters={"container": sb.container.id, "event": OUTSIDE_STOPS}))
    except (docker.errors.DockerException, OSError, ValueError, KeyError):
        return None
    if asked:
        return None
    return (f"the agent stopped its own container: the container's init ended (exit code {state.get('ExitCode')}) "
            "with no stop, kill or restart asked of the engine and no out-of-memory kill")
