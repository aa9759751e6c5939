"""Stage `verify`: hidden-test results, hack detection with evidence, and quality signals.

Tests: where they run is the venue (`verify.venue`, tasks/judge/venue.py). A rollout whose tests ran right
after its episode (venue `fresh`: a new container from its committed files; `in_place`: its own container;
tasks/agent/harness.py) is judged from those results; any other (or every one, with venue `isolated`) is
tested `isolated`: a container of the environment's image plus the captured work dir and outside state,
nothing else of the episode. `Verdict.mode` says which.

This module plans shards, runs the judgement and aggregates stats; the judgement itself is the ordered
list `tasks/judge/checks.py` `CHECKS` (its docstring lists each check with its evidence and flags). Shards
hold whole environments, so after every rollout is judged the successes of one environment are compared
with each other (TRACE's contrastive check, `review_outlier`). `passed` = submitted + all tests passed +
no flag. Infrastructure failures get `verified=False` and never count as a pass or a fail. A verifier
that hangs or prints garbage is a reject (`verifier_error`) for that row; the rest is verified.

Beside the tests, every verdict carries the execution-free monitor's reading of its rollout (tasks/judge/monitor:
`monitor_flags`, `monitor_score`, `monitor_rationale`); `verify.monitor.mode` says whether it may change a verdict.
`stats.json` counts rows flagged per detector (`monitor`), rows with any finding (`monitor_flagged`) and the test
passes the monitor doubts (score at or above the threshold: `monitor_doubted_passes`).
"""

from __future__ import annotations

from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..schemas.common import Reject
from ..schemas.config import MonitorConfig
from ..schemas.environment import EnvSpec
from ..schemas.trajectory import Rollout
from ..schemas.verdict import HackFlag, Verdict
from .engine import Manifest, Retryable, Shard, ShardResult, Stage, StageContext, upstream_parts
from .envs.catalogue import load_envs, sibling_of
from .envs.registry import bring_all_here
from .judge import monitor
from .judge.checks import Judge, judge_rollout
from .judge.hacks import review_outliers
from .judge.verifier import VERIFIER_CAPS
from .sandbox import Sandbox, docker_client


class VerifyStage(Stage):
    name = "verify"
    requires = ("rollout", "synthesize")
    services = ("sandboxes",)
    config_sections = ("verify", "sandbox")
    output = Verdict

    def services_for(self, config) -> tuple[str, ...]:
        """The teacher's service too when a model judge is configured (its server must be up)."""
        return ("teacher", *self.services) if config.verify.monitor.judge is not None else self.services

    def config_section(self, config) -> dict[str, Any]:
        """With a model judge, its teacher's settings count (another model is another verdict)."""
        out = super().config_section(config)
        if (judge := config.verify.monitor.judge) is not None:
            out["judge_teacher"] = next(t for t in config.teachers if t.label == judge).fingerprint()
        return out

    def plan(self, ctx: StageContext, upstream: dict[str, Manifest]) -> list[Shard]:
        table = ctx.store.read_table(upstream_parts(upstream, "rollout"), Rollout, columns=["env_id"])
        counts: dict[str, int] = defaultdict(int)
        for e in table.column("env_id").to_pylist():
            counts[e] += 1
        shards, current, size = [], [], 0
        per = ctx.config.verify.rollouts_per_shard
        for env_id in sorted(counts):  # whole environments per shard
            if current and size + counts[env_id] > per:
                shards.append(current)
                current, size = [], 0
            current.append(env_id)
            size += counts[env_id]
        if current:
            shards.append(current)
        return [Shard(index=i, payload={"env_ids": ids}) for i, ids in enumerate(shards)]

    def run_shard(self, ctx: StageContext, shard: Shard, upstream: dict[str, Manifest]) -> ShardResult:
        envs = load_envs(ctx, upstream["synthesize"], shard.payload["env_ids"])
        rollouts = ctx.store.read_records(upstream_parts(upstream, "rollout"), Rollout,
                                          filters=[("env_id", "in", shard.payload["env_ids"])])
        images = bring_all_here(ctx, envs.values())  # pulled by digest or built on this engine, once
        result = verify_rollouts(ctx, envs, rollouts)
        result.stats.update(images)
        return result

    def retryable(self, rows, rejects: list[Reject]) -> Retryable:
        """`verify_infra` rejects (Docker failed under the verifier): never final; the engine re-runs
        their shard (whole: the contrastive check compares an environment's rollouts together)."""
        at = [i for i, r in enumerate(rejects) if r.reason == "verify_infra"]
        return Retryable(rejects=at, errors=[f"{rejects[i].key}: {rejects[i].detail}" for i in at[:3]])


def verify_rollouts(ctx: StageContext, envs: dict[str, EnvSpec], rollouts: list[Rollout]) -> ShardResult:
    """Verdicts for `rollouts` (whole environments, so successes can be compared): each rollout is judged by
    `judge.checks.CHECKS` in order, then the contrastive check runs over each environment's successes."""
    check_detectors(ctx.config.verify.monitor.detectors)
    client = docker_client(pool_size=2 * ctx.config.verify.concurrency + 4, sandbox=ctx.config.sandbox)
    cfg = ctx.config
    box = lambda env: Sandbox(  # noqa: E731
        client, env.image, cfg.sandbox, workdir=env.workdir, cap_add=VERIFIER_CAPS,
        labels={"trajforge.role": "verify", "trajforge.build": ctx.build_id}, agent=env.agent_user,
        own_entrypoint=True)
    judge = Judge(envs=envs, box=box, test_timeout_s=cfg.verify.test_timeout_s,
                  command_timeout_s=cfg.rollout.command_timeout_s, venue=cfg.verify.venue,
                  replay_on_sibling=cfg.verify.replay_on_sibling, sibling=lambda env: sibling_of(env, replay=True),
                  build=lambda env: _image(client, cfg.sandbox.base_image, env))

    with ThreadPoolExecutor(cfg.verify.concurrency) as pool:
        results = list(pool.map(lambda r: judge_rollout(judge, r), rollouts))
    by_id = {r.rollout_id: r for r in rollouts}
    successes: dict[str, list[Rollout]] = defaultdict(list)
    for v, _ in results:
        if v is not None and v.tests_passed and not v.hacks:
            successes[v.env_id].append(by_id[v.rollout_id])
    outliers: dict[str, HackFlag] = {}
    for group in successes.values():
        outliers.update(review_outliers(group))
    rows, rejects = [], []
    stats: dict[str, Any] = {"verified": 0, "passed": 0, "tests_passed": 0, "unverified": 0, "hacks": {}, "modes": {},
                             "quality_sums": {}, "monitor": {}, "monitor_flagged": 0, "monitor_doubted_passes": 0}
    mon = cfg.verify.monitor
    kept = []
    for v, reject in results:
        if reject:
            rejects.append(reject)
            continue
        if v.rollout_id in outliers:
            v.hacks.append(outliers[v.rollout_id])
        _read_monitor(v, by_id[v.rollout_id], envs.get(v.env_id), mon)
        kept.append(v)
    if mon.judge is not None:
        _model_judge(ctx, kept, by_id, envs, stats)
    for v in kept:
        if (acted := _monitor(v, mon, stats)) is not None:
            rejects.append(acted)
            continue
        v.hack_flags = sorted({h.kind for h in v.hacks})
        v.passed = v.tests_passed and not v.hacks
        rows.append(v)
        stats["verified" if v.verified else "unverified"] += 1
        stats["modes"][v.mode] = stats["modes"].get(v.mode, 0) + 1
        stats["passed"] += int(v.passed)
        stats["tests_passed"] += int(v.tests_passed)
        for k in v.hack_flags:
            stats["hacks"][k] = stats["hacks"].get(k, 0) + 1
        q = v.quality
        for k in ("act_verify_share", "inspect_before_act", "ends_with_verify", "repeated_commands", "recoveries"):
            stats["quality_sums"][k] = stats["quality_sums"].get(k, 0) + float(getattr(q, k))
    return ShardResult(rows, rejects, stats)


def check_detectors(names: list[str] | None) -> None:
    """A clear error naming `verify.monitor.detectors` for a detector no module registers."""
    for name in names or []:
        if name not in monitor.DETECTORS:
            raise ValueError(f"verify.monitor.detectors: unknown detector {name!r}; known: "
                             f"{', '.join(sorted(monitor.DETECTORS))}")


def _read_monitor(v: Verdict, r: Rollout, env: EnvSpec | None, mon: MonitorConfig) -> None:
    """The rule-based detectors' reading of `r` onto `v` (acting on it is `_monitor`'s)."""
    if env is None:
        v.monitor_rationale = "unreadable: the environment is not in this build"
        return
    v.monitor_flags, v.monitor_score, v.monitor_rationale = monitor.monitor(r, env, mon.detectors)


def _model_judge(ctx: StageContext, rows: list[Verdict], by_id: dict[str, Rollout], envs: dict[str, EnvSpec],
                 stats: dict[str, Any]) -> None:
    """`verify.monitor.judge`: the named teacher's verdict on every row (tasks/judge/monitor/model_judge.py), each
    beside a cluster of its environment's other rollouts. A `reward_hack` answer is the `model_judge` finding
    (it raises `monitor_score` like any detector); `task_defect` answers count per environment (`task_defects`).
    Counts go to `stats` flat: `judge` {verdict: rows}, `task_defects` {env_id: rows}."""
    from .judge.monitor import model_judge
    from .teachers import make_teacher

    cfg = ctx.config
    mon = cfg.verify.monitor
    teacher_cfg = next(t for t in cfg.teachers if t.label == mon.judge)
    by_env: dict[str, list[tuple[Rollout, Verdict]]] = defaultdict(list)
    for v in rows:
        by_env[v.env_id].append((by_id[v.rollout_id], v))
    items = [model_judge.Item(v, by_id[v.rollout_id], envs[v.env_id],
                              model_judge.cluster(v, by_env[v.env_id], mon.judge_cluster, mon.judge_benign_share))
             for v in rows if v.env_id in envs]
    try:
        teacher = make_teacher(teacher_cfg, ctx.runtime, ctx.limiter)
    except Exception as err:  # noqa: BLE001 - a judge that cannot start is every row's named outcome
        answers = [("judge_error", f"the judge teacher {mon.judge!r} did not start: {err.__class__.__name__}: "
                                   f"{str(err)[:300]}")] * len(items)
    else:
        answers = model_judge.judge_all(teacher, items, mon.judge_timeout_s, mon.judge_max_chars)
    stats.setdefault("judge", {})
    stats.setdefault("task_defects", {})
    for item, (verdict, evidence) in zip(items, answers):
        v = item.verdict
        v.judge_verdict, v.judge_evidence = verdict, evidence
        stats["judge"][verdict] = stats["judge"].get(verdict, 0) + 1
        if verdict == "task_defect":
            stats["task_defects"][v.env_id] = stats["task_defects"].get(v.env_id, 0) + 1
        if verdict == "reward_hack":
            v.monitor_flags.append(monitor.flag("model_judge", f"the judge: {evidence}"))
            v.monitor_score = monitor.score(v.monitor_flags)
            v.monitor_rationale = "\n".join(filter(None, [v.monitor_rationale, f"model_judge: {evidence[:120]}"]))


def _monitor(v: Verdict, mon: MonitorConfig, stats: dict[str, Any]) -> Reject | None:
    """Acting on the monitor's reading of `v`: under `flag` a high score adds a `monitor` hack flag, under `reject`
    it returns the row's reject instead (the verdict is then not kept). Counts go to `stats` flat (`monitor`:
    {detector: rows}, `monitor_flagged`, `monitor_doubted_passes`), as the engine sums one level of nesting."""
    fired = sorted({f.detector for f in v.monitor_flags})
    stats["monitor_flagged"] += bool(fired)
    for d in fired:
        stats["monitor"][d] = stats["monitor"].get(d, 0) + 1
    high = v.monitor_score >= mon.threshold
    stats["monitor_doubted_passes"] += int(high and v.tests_passed)
    if high and mon.mode == "flag":
        v.hacks.append(HackFlag(kind="monitor", detail=f"monitor score {v.monitor_score:.2f}: "
                                + v.monitor_rationale.splitlines()[0][:300]))
    if high and mon.mode == "reject":
        return Reject(key=v.rollout_id, reason="monitor_reject",
                      detail=f"monitor score {v.monitor_score:.2f}: {v.monitor_rationale[:1000]}")
    return None


def _image(client, base_image: str, env: EnvSpec) -> str:
    from .envs.images import ensure_image

    return ensure_image(client, base_image, env)[0]
