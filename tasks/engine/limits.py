"""Limits on concurrent holders, local to one event loop: the default `LimiterFactory` (engine.contract)
outside a Dask cluster, where the flow gives a cluster-wide one instead (flows/runtime.ClusterLimiter).
Operational: how fast work is admitted, never what it produces."""

from __future__ import annotations

import asyncio
import contextlib


class LocalLimiter:
    """At most `cap` concurrent holders within one event loop."""

    def __init__(self, name: str, cap: int):
        self.name, self.sem = name, asyncio.Semaphore(cap)

    @contextlib.asynccontextmanager
    async def hold(self, timeout: float | None = None):
        """Hold one slot; TimeoutError if none frees up within `timeout` seconds."""
        async with asyncio.timeout(timeout):  # Semaphore.acquire is cancel-safe: no slot is lost
            await self.sem.acquire()
        try:
            yield
        finally:
            self.sem.release()
