"""Stage `rollout`: episodes of every configured teacher (`teacher`, then `extra_teachers`) in every
environment, `samples_per_env` each (a teacher may set its own). Adaptive rounds give more episodes
only to the (environment, teacher) pairs whose calibration asked for them.

Each environment runs under each harness of `rollout.harnesses` that drives its kind (else its kind's own,
tasks/agent/harnesses): (environment, teacher, harness, sample) is one episode with its own rollout id.
Episodes run in the asyncio driver of `agent.driver` (many in flight per shard task).
`teacher_error` / `infra_error` episodes are never final: when the stage runs again (a resume, or
`trajforge rerun rollout` of a committed output) exactly those episodes run again, same rollout ids,
and every model-final episode is kept as it was (`retryable` / `retry_shard`).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ..schemas.calibration import RoundPlan
from ..schemas.common import INFRA_STATUSES, Reject
from ..schemas.environment import EnvSpec
from ..schemas.trajectory import Rollout
from .agent.driver import run_episodes
from .agent.harnesses import episode_harness, harnesses_for
from .engine import Manifest, Retryable, Shard, ShardResult, Stage, StageContext, sum_counters
from .envs.catalogue import load_envs
from .envs.registry import bring_all_here


def _run_here(ctx: StageContext, upstream: dict[str, Manifest], episodes: list[tuple]) -> ShardResult:
    """`episodes` on this worker's engine, their images brought here first (present, pulled by digest or
    built: counted in the stats)."""
    envs = load_envs(ctx, upstream["synthesize"], {e[0] for e in episodes})
    images = bring_all_here(ctx, envs.values())
    result = run_episodes(ctx, envs, episodes)
    result.stats.update(images)
    return result


class RolloutStage(Stage):
    name = "rollout"
    requires = ("synthesize",)
    services = ("teacher", "sandboxes")
    config_sections = ("rollout", "teacher", "sandbox")
    output = Rollout

    def config_section(self, config) -> dict[str, Any]:
        """Only the active backend's settings of each teacher count; a replay file counts by its content; the venue
        (`verify.venue`) counts: with `fresh` or `in_place` the rollout rows carry the hidden tests' results."""
        out = super().config_section(config)
        out["teacher"] = config.teacher.fingerprint()
        out["venue"] = config.verify.venue  # fresh / in_place: the rows carry the test results (judge/venue.py)
        if config.extra_teachers:
            out["extra_teachers"] = [t.fingerprint() for t in config.extra_teachers]
        return out

    def plan(self, ctx: StageContext, upstream: dict[str, Manifest]) -> list[Shard]:
        """Round 0: `samples_per_env` episodes per environment. An adaptive round (a `calibrate`
        manifest upstream): the extra samples that calibration asked for, numbered on from the last."""
        cfg = ctx.config
        harnesses = self._harnesses(ctx, upstream) if "synthesize" in upstream else {}
        if "calibrate" in upstream:  # only the teachers whose label of that environment is unsure
            plan = RoundPlan.of(upstream["calibrate"].stats)
            index = {t.label: i for i, t in enumerate(cfg.teachers)}
            work = [self._episode(e, k, index[label], h) for e, n in sorted(plan.needs_more.items())
                    for k in range(plan.next_sample[e], plan.next_sample[e] + n)
                    for label, h in self._unsure(plan, e, cfg.teacher.label, harnesses.get(e, [None]))
                    if label in index]
        else:
            work = [self._episode(e, k, i, h) for e in sorted(harnesses) for i, t in enumerate(cfg.teachers)
                    for h in harnesses[e] for k in range(t.samples_per_env or cfg.rollout.samples_per_env)]
        n = ctx.config.rollout.episodes_per_shard
        return [Shard(index=i, payload={"episodes": work[j:j + n]}) for i, j in enumerate(range(0, len(work), n))]

    @staticmethod
    def _harnesses(ctx: StageContext, upstream: dict[str, Manifest]) -> dict[str, list[str | None]]:
        """Per environment, the harnesses its episodes run under (`rollout.harnesses`; None: its kind's own)."""
        rows = ctx.store.read_table(upstream["synthesize"].parts, EnvSpec, columns=["env_id", "kind"]).to_pydict()
        return {e: [episode_harness(env, h) for h in harnesses_for(env, ctx.config.rollout.harnesses)]
                for e, kind in zip(rows["env_id"], rows["kind"]) for env in [EnvSpec.model_construct(env_id=e, kind=kind)]}

    @staticmethod
    def _unsure(plan: RoundPlan, env_id: str, default: str, harnesses: list[str | None]) -> list[tuple[str, str | None]]:
        """The (teacher, harness) pairs of `env_id` an adaptive round runs: those calibration named (a build of
        several harnesses names each pair's), else each unsure teacher under the environment's harnesses."""
        teachers = plan.unsure_teachers.get(env_id, [default])
        if env_id in plan.unsure_harnesses:
            return list(zip(teachers, plan.unsure_harnesses[env_id]))
        return [(t, h) for t in teachers for h in harnesses]

    @staticmethod
    def _episode(env_id: str, sample: int, teacher: int, harness: str | None) -> list:
        """A shard's episode: [env, sample, teacher index] under the kind's own harness (the payload it always
        was), + the harness's name under any other."""
        return [env_id, sample, teacher] + ([harness] if harness else [])

    def run_shard(self, ctx: StageContext, shard: Shard, upstream: dict[str, Manifest]) -> ShardResult:
        return _run_here(ctx, upstream, [tuple(e) for e in shard.payload["episodes"]])

    def retryable(self, rows: pa.Table, rejects: list[Reject]) -> Retryable:
        """Episodes that ended in an infrastructure outcome (teacher or Docker), with their errors."""
        mask = pc.is_in(rows.column("status"), value_set=pa.array(sorted(INFRA_STATUSES))).to_pylist()
        at = [i for i, m in enumerate(mask) if m]
        errors = rows.column("error").take(pa.array(at[:3], pa.int64())).to_pylist() if at else []
        return Retryable(rows=at, errors=[(e or "no error recorded").strip().splitlines()[0] for e in errors])

    def retry_shard(self, ctx: StageContext, shard: Shard, upstream: dict[str, Manifest], rows: pa.Table,
                    rejects: list[Reject]) -> ShardResult:
        """The same episodes again (env, sample, teacher, harness): one row each, in order, same rollout ids."""
        index = {t.label: i for i, t in enumerate(ctx.config.teachers)}
        episodes = [(e, k, index[t], h) for e, k, t, h in zip(rows.column("env_id").to_pylist(),
                                                              rows.column("sample").to_pylist(),
                                                              rows.column("teacher").to_pylist(),
                                                              rows.column("harness").to_pylist())]
        return _run_here(ctx, upstream, episodes)

    def retry_stats(self, old: dict[str, Any], new: dict[str, Any], rows: pa.Table) -> dict[str, Any]:
        """Costs (tokens, seconds, retries) of both runs summed; outcome counts from the rows kept."""
        out = sum_counters([old, new])
        out.update(episodes=rows.num_rows, status=dict(Counter(rows.column("status").to_pylist())),
                   teachers=dict(Counter(rows.column("teacher").to_pylist())),
                   harnesses=dict(Counter(rows.column("harness").to_pylist())))
        return out

    def progress_text(self, totals: dict[str, Any], elapsed_s: float) -> str:
        if not totals:
            return ""
        statuses = " ".join(f"{k}={v}" for k, v in sorted(totals.get("status", {}).items()))
        tps = totals.get("completion_tokens", 0) / elapsed_s if elapsed_s > 0 else 0.0
        return (f"episodes {totals.get('done', 0)}/{totals.get('total', 0)} · running {totals.get('running', 0)} "
                f"· {tps:.0f} tok/s · {statuses}")
