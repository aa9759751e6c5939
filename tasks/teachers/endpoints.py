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
- Dead for good: the build may publish, per endpoint, a file that appears once its server is known
  dead (the managed vLLM server's watchdog gave up: `runtime[DEAD_KEY]`). After a failed request the
  pool looks for it (at most once per `RECHECK_S` per endpoint); once found, the endpoint never
  returns to the rotation, and a turn with no endpoint left fails at once (`TeacherError`, a
  `teacher_error` episode: infrastructure, re-run later) instead of retrying until `max_wait_s`.
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
from ..engine.limits import LocalLimiter
from .base import TeacherError, stable_hash

if TYPE_CHECKING:
    from .openai import OpenAIClientConfig


DEAD_KEY = "teacher_dead"  # in a stage's runtime: {endpoint url: URL of the file declaring its server dead}
RECHECK_S = 1.0  # at most one look for an endpoint's dead file per second (per pool)


def read_dead_file(url: str) -> str | None:
    """Why the server is dead, if the file at `url` (any fsspec URL) exists; None otherwise or unreadable."""
    import json

    import fsspec

    try:
        fs, path = fsspec.core.url_to_fs(url)
        if not fs.exists(path):
            return None
        with fs.open(path, "r") as f:
            return str(json.loads(f.read()).get("why") or "its server is dead")
    except FileNotFoundError:
        return None
    except Exception as err:  # present but unreadable (being written): it exists, so the server is dead
        return f"its server is dead ({err.__class__.__name__} reading {url})"


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
    dead_file: str | None = None  # where the build declares this endpoint's server dead for good
    gone: str | None = None  # why it is dead for good (never back in rotation)
    looked_at: float = float("-inf")  # last look for `dead_file`

    def alive(self, now: float) -> bool:
        return now >= self.dead_until


class EndpointPool:
    def __init__(self, cfg: "OpenAIClientConfig", urls: list[str], limiter: LimiterFactory | None = None,
                 dead_files: dict[str, str] | None = None):
        from openai import AsyncOpenAI

        if not urls:
            raise ValueError("no teacher endpoint configured")
        key = os.environ.get(cfg.api_key_env, "EMPTY")
        self.cfg = cfg
        self.endpoints = [Endpoint(u, AsyncOpenAI(base_url=u, api_key=key, timeout=cfg.request_timeout_s,
                                                  max_retries=0), (limiter or LocalLimiter)(limiter_name(u), cfg.max_inflight_per_endpoint))
                          for u in urls]
        for e in self.endpoints:
            e.dead_file = (dead_files or {}).get(e.url)

    def ranking(self, key: str) -> list[Endpoint]:
        """Rendezvous order for `key`: stable, and only the dead endpoint's share moves."""
        return sorted(self.endpoints, key=lambda e: stable_hash(f"{e.url}|{key}"), reverse=True)

    def pick(self, key: str) -> Endpoint:
        """The first live endpoint of `key`'s ranking (else the one back soonest); TeacherError when
        every endpoint is dead for good."""
        now = time.monotonic()
        ranked = [e for e in self.ranking(key) if e.gone is None]
        if not ranked:
            raise TeacherError("; ".join(f"teacher {e.url} is dead for good: {e.gone}" for e in self.endpoints)
                               + " (the turn fails at once; the episode is re-run when the stage runs again)")
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

    async def is_gone(self, e: Endpoint) -> bool:
        """Whether `e`'s server is known dead for good (its dead file exists); looked up at most once
        per RECHECK_S, and remembered once true."""
        if e.gone is not None:
            return True
        now = time.monotonic()
        if not e.dead_file or now - e.looked_at < RECHECK_S:
            return False
        e.looked_at = now
        why = await asyncio.to_thread(read_dead_file, e.dead_file)
        if why is not None:
            e.gone = why
        return why is not None

    async def aclose(self) -> None:
        for e in self.endpoints:
            with contextlib.suppress(Exception):
                await e.client.close()
