"""A build's limits on its rollout sandboxes, shared by every worker (`sandbox.fleet`): engines and
registries throttle a fleet that starts thousands of containers at once, and a limit per worker
cannot see the others.

Both limits are leases of limiters from the stage context (`engine.contract.LimiterFactory`): inside
Dask workers a cluster-wide `distributed.Semaphore` per build (the scheduler expires the leases of a
worker that died), else one per event loop (`engine.limits.LocalLimiter`).
- sandboxes alive (`max_in_flight`): one lease per episode, from before its sandbox is created until
  it is removed;
- creations per second (`creations_per_s`): one lease of a `burst`-sized limiter per creation, held
  `burst / creations_per_s` seconds from when it was granted, so no window of that length sees more
  than `burst` creations by all workers together.

Invariants: every lease is released (`aclose` waits out the creation leases still held, so a shard
that ends early does not hand its share of the rate to the others before its window is over); the
time spent waiting is counted (`stats`), never charged to an episode's budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, AsyncIterator

from ...schemas.config import FleetConfig
from ..engine.contract import LimiterFactory
from ..engine.limits import LocalLimiter


class Fleet:
    def __init__(self, cfg: FleetConfig, build_id: str, limiter: LimiterFactory | None = None):
        make = limiter or LocalLimiter
        self.cfg = cfg
        self.alive_limit = make(f"trajforge-fleet-alive-{build_id}", cfg.max_in_flight) if cfg.max_in_flight else None
        self.rate_limit = make(f"trajforge-fleet-create-{build_id}", cfg.burst) if cfg.creations_per_s else None
        self.window_s = cfg.burst / cfg.creations_per_s if cfg.creations_per_s else 0.0
        self.waited = {"alive": 0.0, "create": 0.0}
        self.creations = 0
        self._held: set[asyncio.Task] = set()

    @contextlib.asynccontextmanager
    async def alive(self) -> AsyncIterator[None]:
        """Hold one of the build's `max_in_flight` sandbox leases (no limit: at once)."""
        if self.alive_limit is None:
            yield
            return
        t = time.monotonic()
        async with self.alive_limit.hold():
            self.waited["alive"] += time.monotonic() - t
            yield

    async def creation(self) -> None:
        """Return once a sandbox may be created within the build's `creations_per_s`."""
        self.creations += 1
        if self.rate_limit is None:
            return
        t, granted = time.monotonic(), asyncio.Event()

        async def hold_for_window() -> None:
            async with self.rate_limit.hold():
                granted.set()
                await asyncio.sleep(self.window_s)

        holder = asyncio.ensure_future(hold_for_window())
        self._held.add(holder)
        holder.add_done_callback(self._held.discard)
        waiting = asyncio.ensure_future(granted.wait())
        try:
            await asyncio.wait({holder, waiting}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiting.cancel()
        if not granted.is_set():
            holder.result()  # the limiter failed (e.g. the scheduler is gone): its error, not a hang
        self.waited["create"] += time.monotonic() - t

    async def aclose(self) -> None:
        """Wait out the creation leases still held (at most `burst / creations_per_s` seconds)."""
        if self._held:
            await asyncio.gather(*self._held, return_exceptions=True)

    def stats(self) -> dict[str, Any]:
        """What the limits cost this shard (summed over shards by the engine)."""
        return {"fleet_creations": self.creations, "fleet_wait_alive_s": round(self.waited["alive"], 3),
                "fleet_wait_create_s": round(self.waited["create"], 3)}
