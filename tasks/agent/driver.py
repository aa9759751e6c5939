"""The asyncio driver of one shard's episodes: up to `rollout.concurrency` conversations in flight.

vLLM's continuous batching needs many concurrent requests; the endpoint pool caps requests per
server across the cluster. Containers are not conversations: up to 2 x `rollout.concurrency`
episodes hold one, and `rollout.concurrency` of them talk to the teacher. An episode starts its
container before it waits for a conversation slot (the start, seconds on a busy host, overlaps other
episodes' turns) and gives the slot back once it asks the teacher nothing more (settle, capture,
hidden tests and removal run beside the next conversations).
Infrastructure failures (Docker) are retried `infra_retries` times, then recorded as `infra_error`
rows; teacher outages end episodes as `teacher_error`. Neither is ever counted as the teacher failing
a task. Live counters (episodes done/running, tokens, statuses) go to `ctx.report`.
"""

from __future__ import annotations

import asyncio
import time
import traceback
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ...schemas.config import TeacherConfig
from ...schemas.environment import EnvSpec
from ...schemas.trajectory import Message, Rollout
from ..engine.contract import ShardResult, StageContext
from ..judge.venue import named
from ..judge.verifier import VERIFIER_CAPS
from ..sandbox import Sandbox, SandboxError, docker_client
from ..sandbox.fleet import Fleet
from ..teachers import make_teacher
from .harness import EpisodeSettings, harness_label, rollout_id, run_episode
from .harnesses import bind_rendering, episode_harness


class _Slot:
    """One hold on a semaphore, released at most once (by the harness when the conversation is over,
    or by the driver when the attempt ends, whichever comes first)."""

    def __init__(self, sem: asyncio.Semaphore):
        self.sem, self.held = sem, False

    async def acquire(self) -> None:
        await self.sem.acquire()
        self.held = True

    def release(self) -> None:
        if self.held:
            self.held = False
            self.sem.release()


def episode_settings(ctx: StageContext, teacher: TeacherConfig | None = None) -> EpisodeSettings:
    cfg = ctx.config
    t = teacher or cfg.teacher
    budget = cfg.rollout.context_budget_tokens
    if budget is None:
        budget = t.context_budget()
    return EpisodeSettings(cfg.rollout.max_turns, cfg.rollout.command_timeout_s, cfg.rollout.episode_timeout_s,
                           t.tool_calling, cfg.sandbox.final_state_limit_bytes, budget,
                           t.max_tokens, cfg.verify.venue, cfg.rollout.test_timeout_s,
                           teacher_max_wait_s=t.max_wait_s, agent_tokens_per_s=t.agent_tokens_per_s)


def run_episodes(ctx: StageContext, envs: dict[str, EnvSpec], episodes: list[tuple],
                 teacher=None) -> ShardResult:
    """Run `episodes` [(env_id, sample[, teacher index into config.teachers[, harness name]])] with the
    configured teachers (or `teacher` for all), each under its harness (None: its kind's own, tasks/agent/harnesses);
    one row per episode, always."""
    conc = ctx.config.rollout.concurrency

    async def main() -> ShardResult:
        # Every episode blocks threads on Docker calls: size the pool for the episodes in flight
        # (the default, cpu_count + 4, would serialize them on a small machine).
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=4 * conc + 8))
        return await _drive(ctx, envs, episodes, teacher)

    return asyncio.run(main())


async def _drive(ctx: StageContext, envs: dict[str, EnvSpec], episodes: list[tuple],
                 teacher=None) -> ShardResult:
    cfg = ctx.config
    client = docker_client(pool_size=4 * cfg.rollout.concurrency + 4, sandbox=cfg.sandbox)
    used = sorted({ep[2] if len(ep) > 2 else 0 for ep in episodes})
    teachers = {i: teacher or make_teacher(cfg.teachers[i], ctx.runtime, ctx.limiter) for i in used}
    settings = {i: episode_settings(ctx, cfg.teachers[i]) for i in used}
    conversations = asyncio.Semaphore(cfg.rollout.concurrency)  # what the teacher sees
    episodes_alive = asyncio.Semaphore(2 * cfg.rollout.concurrency)  # + those finishing: containers alive
    fleet = Fleet(cfg.sandbox.fleet, ctx.build_id, ctx.limiter)  # the same, shared by all workers of the build
    live: dict[str, Any] = {"total": len(episodes), "done": 0, "running": 0, "completion_tokens": 0,
                            "status": Counter(), "infra_retries": 0}
    errors: Counter = Counter()
    t0 = time.monotonic()

    def report(force: bool = False) -> None:
        ctx.report(force=force, **{**live, "status": dict(live["status"]), **fleet.stats()})

    def failed_row(env: EnvSpec, sample: int, status: str, error: str, attempts: int, teacher,
                   harness: str | None) -> Rollout:
        return Rollout(rollout_id=rollout_id(env.env_id, teacher.label, sample, episode_harness(env, harness)),
                       env_id=env.env_id, teacher=teacher.label, harness=harness_label(env, harness), sample=sample,
                       messages=[Message(role="user", content=env.instruction)], status=status,
                       error=error[:2000], attempts=attempts)

    async def one(env_id: str, sample: int, ti: int, harness: str | None) -> Rollout:
        env, teacher, s = envs[env_id], teachers[ti], settings[ti]
        harness = episode_harness(env, harness)  # None: the kind's own (a retried row names it)
        rid = rollout_id(env_id, teacher.label, sample, harness)
        async with episodes_alive, fleet.alive():
            last_err, attempts, counted = "", cfg.rollout.infra_retries + 1, False  # counted: in `running`
            try:
                for attempt in range(1, attempts + 1):
                    slot = _Slot(conversations)
                    if not counted:
                        counted = True
                        live["running"] += 1
                        report()
                    try:
                        await fleet.creation()
                        r = await run_episode(
                            env, bind_rendering(teacher.session(env, sample, rid), env, harness),
                            lambda: Sandbox(client, env.image, cfg.sandbox, workdir=env.workdir,
                                            labels={"trajforge.build": ctx.build_id, "trajforge.env": env_id},
                                            cap_add=VERIFIER_CAPS if named(s.venue).during_rollout else (),
                                            agent=env.agent_user),
                            s, teacher.label, sample, slot=slot, **({"harness": harness} if harness else {}))
                        r.attempts = attempt
                        return r
                    except SandboxError as err:
                        last_err = f"SandboxError: {err}"
                    except Exception as err:  # a bug or an unexpected failure: kept, classified, retried
                        last_err = f"{err.__class__.__name__}: {err}\n{traceback.format_exc(limit=4)}"
                    finally:
                        slot.release()
                    live["infra_retries"] += 1
                    errors[last_err.split(":", 1)[0]] += 1
                return failed_row(env, sample, "infra_error", last_err, attempts, teacher, harness)
            finally:
                live["running"] -= counted

    async def tracked(env_id: str, sample: int, ti: int = 0, harness: str | None = None) -> Rollout:
        r = await one(env_id, sample, ti, harness)
        live["done"] += 1
        live["completion_tokens"] += r.completion_tokens
        live["status"][r.status] += 1
        report(force=live["done"] == live["total"])
        return r

    try:
        rows = await asyncio.gather(*(tracked(*ep) for ep in episodes))
    finally:
        for t in {id(t): t for t in teachers.values()}.values():
            await t.aclose()
        await fleet.aclose()
        client.close()
    wall = time.monotonic() - t0
    stats: dict[str, Any] = {
        "episodes": len(rows), "status": dict(Counter(r.status for r in rows)),
        "infra_retries": live["infra_retries"], "infra_error_kinds": dict(errors),
        "completion_tokens": sum(r.completion_tokens for r in rows),
        "prompt_tokens": sum(r.prompt_tokens for r in rows),
        "turns": sum(r.turns for r in rows), "commands": sum(len(r.steps) for r in rows),
        "killed_by": dict(Counter(s.killed_by for r in rows for s in r.steps if s.killed_by)),
        "teacher_seconds": round(sum(u.latency_s for r in rows for u in r.usage), 3),
        "command_seconds": round(sum(s.duration_s for r in rows for s in r.steps), 3),
        "episode_seconds": round(sum(r.wall_s for r in rows), 3),
        "driver_wall_seconds": round(wall, 3),
        **fleet.stats(),
    }
    stats["teachers"] = dict(Counter(r.teacher for r in rows))
    stats["harnesses"] = dict(Counter(r.harness for r in rows))
    for t in teachers.values():
        if hasattr(t, "endpoint_stats"):
            es = t.endpoint_stats()
            stats.setdefault("endpoints", {}).update({u: v["requests"] for u, v in es.items()})
            stats.setdefault("endpoint_errors", {}).update({u: v["errors"] for u, v in es.items()})
            stats.setdefault("endpoint_rate_limited", {}).update({u: v.get("rate_limited", 0) for u, v in es.items()})
            stats["teacher_wait_seconds"] = round(stats.get("teacher_wait_seconds", 0) + getattr(t, "wait_s", 0.0), 3)
    return ShardResult(list(rows), [], stats)
