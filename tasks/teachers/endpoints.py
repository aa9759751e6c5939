"""Routing, limits and health of OpenAI-compatible endpoints (operational: how requests travel,
never what a teacher answers, so no stage fingerprints this module).

- Sticky routing: an episode's requests go to one endpoint (rendezvous hash of the rollout id over
  the live endpoints), so the server's prefix cache holds its growing conversation.
- In-flight cap per endpoint: a limiter from the stage context (the flow gives a cluster-wide one
  inside Dask workers), else an asyncio semaphore local to the event loop.
- An endpoint that fails `dead_after_failures` times in a row (connection errors, 5xx, stalls: a
  death) leaves the rotation for `dead_cooldown_s`; its episodes move to the next endpoint of their
  ranking. A 429 (or a 503 with Retry-After) is the server asking to slow down: counted as
  `rate_limited`, never as a death.
- Waiting for a slot is bounded (`hold(timeout)` raises TimeoutError): queue time is teacher time.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ..engine.contract import LimiterFactory
from .base import stable_hash

if TYPE_CHECKING:
    from .openai import OpenAIClientConfig


class LocalLimiter:
    """At most `cap` concurrent holders within one event loop (the default outside a cluster)."""

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


def limiter_name(url: str) -> str:
    """One name per endpoint URL: the same cluster-wide limit in every worker."""
    return f"trajforge-endpoint-{hashlib.sha256(url.encode()).hexdigest()[:16]}"


@dataclass
class Endpoint:
    url: str
    client: Any
    gate: Any
    failures: int = 0
    dead_until: float = 0.0
    requests: int = 0
    errors: int = 0  # deaths: connection errors, 5xx, stalls
    rate_limited: int = 0  # 429 / 503 with Retry-After: alive, asking to slow down

    def alive(self, now: float) -> bool:
        return now >= self.dead_until


class EndpointPool:
    def __init__(self, cfg: "OpenAIClientConfig", urls: list[str], limiter: LimiterFactory | None = None):
        from openai import AsyncOpenAI

        if not urls:
            raise ValueError("no teacher endpoint configured")
        key = os.environ.get(cfg.api_key_env, "EMPTY")
        self.cfg = cfg
        self.endpoints = [Endpoint(u, AsyncOpenAI(base_url=u, api_key=key, timeout=cfg.request_timeout_s,
                                                  max_retries=0), (limiter or LocalLimiter)(limiter_name(u), cfg.max_inflight_per_endpoint))
                          for u in urls]

    def ranking(self, key: str) -> list[Endpoint]:
        """Rendezvous order for `key`: stable, and only the dead endpoint's share moves."""
        return sorted(self.endpoints, key=lambda e: stable_hash(f"{e.url}|{key}"), reverse=True)

    def pick(self, key: str) -> Endpoint:
        now = time.monotonic()
        ranked = self.ranking(key)
        for e in ranked:
            if e.alive(now):
                return e
        return min(ranked, key=lambda e: e.dead_until)  # all dead: the one back soonest

    def report(self, e: Endpoint, outcome: Literal["ok", "rate_limited", "error"]) -> None:
        """Count one request's outcome; `error` (a death) counts towards taking `e` out of rotation."""
        e.requests += 1
        if outcome == "rate_limited":
            e.rate_limited += 1
            return
        if outcome == "ok":
            e.failures = 0
            return
        e.errors += 1
        e.failures += 1
        if e.failures >= self.cfg.dead_after_failures:
            e.dead_until = time.monotonic() + self.cfg.dead_cooldown_s
            e.failures = 0

    async def aclose(self) -> None:
        for e in self.endpoints:
            with contextlib.suppress(Exception):
                await e.client.close()
