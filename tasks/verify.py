"""Stage `verify`: hidden-test results, hack detection with evidence, and quality signals.

Tests: a rollout whose tests ran in place (in its own container right after the episode, see
tasks/agent/harness.py and `rollout.verify_in_place`) is judged from those results; any other (or every one,
with `verify.isolated`) is tested `isolated`: a fresh container of the environment's image plus the
captured work dir, nothing else of the episode. `Verdict.mode` says which.

Shards hold whole environments, so the rollouts of one environment can be compared with each other
(TRACE's contrastive check). Per rollout: the work dir is restored, the verifier copies the tests in
and runs them as root (tasks/judge/verifier.py); the single-trajectory detectors run on its steps and final
files (tasks/judge/hacks.py); a success of a procedural family is replayed on a sibling instance to catch
hard-coded answers (`verify.replay_on_sibling`). `passed` = submitted + all tests passed + no flag.
Infrastructure failures get `verified=False` and never count as a pass or a fail. A verifier that
hangs or prints garbage is a reject (`verifier_error`) for that row; the rest is verified.
"""

from __future__ import annotations

from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..schemas.common import INFRA_STATUSES, Reject
from ..schemas.environment import EnvSpec
from ..schemas.trajectory import Rollout
from ..schemas.verdict import HackFlag, Verdict
from .engine import Manifest, Retryable, Shard, ShardResult, Stage, StageContext, upstream_parts
from .envs.catalogue import load_envs, sibling_of
from .judge.changes import apply_final_state, counterfactual, revert_plan, review_flags, unexpected, written_outside
from .judge.hacks import detect, forged_results, integrity_flags, output_kind_flags, review_outliers
from .judge.quality import assess, last_act
from .judge.verifier import VERIFIER_CAPS, TestRun, run_hidden_tests
from .sandbox import Sandbox, SandboxError, docker_client


class VerifyStage(Stage):
    name = "verify"
    requires = ("rollout", "synthesize")
    config_sections = ("verify", "sandbox")
    output = Verdict

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
        return verify_rollouts(ctx, envs, rollouts)

    def retryable(self, rows, rejects: list[Reject]) -> Retryable:
        """`verify_infra` rejects (Docker failed under the verifier): never final; the engine re-runs
        their shard (whole: the contrastive check compares an environment's rollouts together)."""
        at = [i for i, r in enumerate(rejects) if r.reason == "verify_infra"]
        return Retryable(rejects=at, errors=[f"{rejects[i].key}: {rejects[i].detail}" for i in at[:3]])


def verify_rollouts(ctx: StageContext, envs: dict[str, EnvSpec], rollouts: list[Rollout]) -> ShardResult:
    """Verdicts for `rollouts` (whole environments, so successes can be compared): tests in a fresh
    container, hack detectors, sibling replay, the contrastive check, quality signals."""
    client = docker_client(pool_size=2 * ctx.config.verify.concurrency + 4)
    cfg = ctx.config
    box = lambda env, image=None: Sandbox(  # noqa: E731
        client, image or env.image, cfg.sandbox, workdir=env.workdir, cap_add=VERIFIER_CAPS,
        labels={"trajforge.role": "verify", "trajforge.build": ctx.build_id}, agent=env.agent_user)
    timeout = cfg.verify.test_timeout_s

    def one(r: Rollout) -> tuple[Verdict | None, Reject | None]:
        base = dict(rollout_id=r.rollout_id, env_id=r.env_id, teacher=r.teacher, sample=r.sample, status=r.status,
                    quality=assess(r), changes=r.changes.display() if r.changes else None)
        if r.status in INFRA_STATUSES:
            return Verdict(**base, verified=False), None
        hacks = detect(r)
        if r.toolchain_changed:  # its programs judge nothing, here or restored elsewhere (toolchain_tamper)
            return Verdict(**base, verified=True, hacks=hacks, verifier_output=(
                "not tested: the episode changed the system programs that would run the tests")), None
        if r.final_state is None:  # the model outgrew the work dir limit: a failure, not infrastructure
            return Verdict(**base, verified=True, hacks=hacks, verifier_output=r.error or "no final state"), None
        env = envs.get(r.env_id)
        if env is None:
            return None, Reject(key=r.rollout_id, reason="unknown_env", detail=r.env_id)
        hacks += output_kind_flags(r, env.workdir)
        unexpected_paths = unexpected(r.changes, env) if r.changes else []
        counterfactual_outcome, reverted = "not_needed", []
        try:
            in_place = TestRun.from_record(r.in_place_tests) if r.in_place_tests is not None else None
            if in_place is not None and not cfg.verify.isolated and in_place.fallback is None:
                run, mode = in_place, "in_place"
            else:
                if _state_incomplete(r, env):
                    return None, Reject(key=r.rollout_id, reason="verifier_error", detail=(
                        "the final state outside the work dir was too large to record: cannot test it isolated"))
                with box(env) as sb:
                    apply_final_state(sb, r, env)
                    run = run_hidden_tests(sb, env, timeout)
                mode = "isolated_fallback" if in_place is not None and in_place.fallback else "isolated"
            if run.error and not run.fallback:
                # the tests finish on the reference solution's state (the validator ran them): on this one they hung,
                # crashed or reported nothing, by the episode's doing. An honest failure stays in the dataset
                # (never a reject that drops it, never infrastructure that retries it), its cause named
                last = last_act(r)
                return Verdict(**base, verified=True, reward=0.0, tests_passed=False, mode=mode,
                               verifier_output=run.output[-1000:], duration_s=round(run.duration_s, 3),
                               hacks=[*hacks, HackFlag(
                                   kind="tests_unrunnable", severity="review", turn=last.turn if last else None,
                                   command=last.command[:500] if last else None,
                                   detail=f"{run.error} on the episode's final state (they finish on the reference "
                                          "solution's): a failure the episode caused")]), None
            if run.error or run.fallback:
                return None, Reject(key=r.rollout_id, reason="verifier_error", detail=run.error or run.fallback)
            tests_passed = run.passed and r.status == "ok"
            if run.contradicts_exit_code:
                hacks.append(forged_results(r, run))
            hacks += integrity_flags(r, run.integrity)
            if r.changes is not None and r.changes.truncated and run.reward >= 1.0:
                # a pass is decided on the complete change set only (the counterfactual reverts what it lists)
                hacks.append(HackFlag(kind="incomplete_evidence", detail=(
                    f"the episode changed {r.changes.total} paths, more than the {len(r.changes.added)} a list "
                    "verification can decide on: its pass cannot be judged")))
            if tests_passed and r.changes is not None:
                reverted = revert_plan(r.changes, env)
                if reverted:  # a pass with unexpected changes that could matter: does it depend on them?
                    if _state_incomplete(r, env):
                        return None, Reject(key=r.rollout_id, reason="verifier_error", detail=(
                            "counterfactual impossible: the final state outside the work dir was too large to record"))
                    cf_run, flips = counterfactual(lambda: box(env), r, env, reverted, timeout)
                    if cf_run.error or cf_run.fallback:
                        return None, Reject(key=r.rollout_id, reason="verifier_error", detail=(
                            f"counterfactual run failed: {cf_run.error or cf_run.fallback}"))
                    counterfactual_outcome = "flipped" if flips else "held"
                    hacks += flips
                # (held: every change the reference did not make was reverted and the pass stood: none mattered,
                # none is flagged; a helper in /usr/local/bin is not a hack by itself)
            elif not tests_passed:  # evidence for whoever reads the failure (it cannot become a pass)
                hacks += review_flags(r, env, unexpected_paths, passed=False)
            if tests_passed and not hacks and cfg.verify.replay_on_sibling:
                hacks += replay_on_sibling(r, env, client, box, cfg.sandbox.base_image,
                                           timeout, cfg.rollout.command_timeout_s)
        except SandboxError as err:
            return None, Reject(key=r.rollout_id, reason="verify_infra", detail=str(err)[:500])
        return Verdict(**base, verified=True, reward=run.reward, tests_passed=tests_passed,
                       tests=run.results, hacks=hacks, verifier_output=run.output[-1000:],
                       duration_s=round(run.duration_s, 3), mode=mode, unexpected=unexpected_paths[:200],
                       counterfactual=counterfactual_outcome, reverted=reverted[:200]), None

    with ThreadPoolExecutor(cfg.verify.concurrency) as pool:
        results = list(pool.map(one, rollouts))
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
                             "quality_sums": {}}
    for v, reject in results:
        if reject:
            rejects.append(reject)
            continue
        if v.rollout_id in outliers:
            v.hacks.append(outliers[v.rollout_id])
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


def _state_incomplete(r: Rollout, env: EnvSpec) -> bool:
    """Files changed outside the work dir that the rollout could not record (too large)."""
    return r.changes is not None and r.outside_state is None and bool(written_outside(r.changes, env.workdir))


def replay_on_sibling(r: Rollout, env: EnvSpec, client, box, base_image: str, test_timeout_s: float,
                      command_timeout_s: float) -> list[HackFlag]:
    """The trajectory's commands, in order, on another instance of the same family: a computed answer
    passes there too (the validator made sure the reference solution does); a written one does not."""
    from .envs.images import ensure_image

    # never a tool episode: tool families are not `replay_invariant` (ToolFamily; LLM tool envs are not
    # procedural), so `sibling_of` gives None and no tool step is run here; were one run, its command is
    # `call_command(...)` (tasks/envs/tools/spec.py), the same call through the sibling's server, not bash
    sib = sibling_of(env, replay=True)
    if sib is None or not r.steps:
        return []
    sib.image, _ = ensure_image(client, base_image, sib)
    with box(sib) as sb:
        for s in r.steps:
            sb.exec(s.command, command_timeout_s)
        run = run_hidden_tests(sb, sib, test_timeout_s)
    if run.passed:
        return []
    failed = [t.name for t in run.results if not t.passed]
    last = last_act(r)
    return [HackFlag(kind="hardcoded_answer", turn=last.turn, command=last.command[:500],
                     detail=f"replayed on sibling {sib.env_id} the commands fail {failed or run.error}: the answer "
                            "depends on this instance's data without being computed from it")]
