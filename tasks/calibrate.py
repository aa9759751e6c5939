"""Stage `calibrate`: solve rate per (environment, teacher, harness) with a Wilson score interval, a difficulty
label, the posterior probability that the label is right and whether it is certain; and one pooled
difficulty per environment across teachers (`difficulty.pooled`). Each label's meaning is stated once,
in `schemas.calibration.LABEL_DEFINITIONS` (`difficulty.bands.label_definitions(cfg)` fills in the thresholds).
Infrastructure/teacher errors and unverified rows are excluded from the counts (reported in `excluded`);
hack-flagged rollouts count as attempts, never as passes. A pair with no counted attempt is
`unlabelled`, never `unsolved`; an environment without a reference solution that no teacher passed is
`unverified`, never `unsolved`.

Adaptive rounds (`calibrate.adaptive`): the stage also decides which (environment, teacher) pairs get
more rollouts (`next_rollouts`): not the certain ones (posterior mass on the label >= `confidence`: so
0 of n stops once the posterior says p < unsolved_below), not those the rule calls sure (by default:
`batch` more are expected to raise P(label right) by less than `min_gain` per rollout), not those at
`max_samples`; the rest get `batch` more, highest expected gain first, while the build-wide `budget`
lasts. The decision is a typed `RoundPlan` in the manifest's stats; the flow runs another
rollout -> verify -> calibrate round for exactly those.

A pair's harness is None under the environment kind's own harness (a build with the default
`rollout.harnesses` writes the rows it always wrote); under another harness (tasks/agent/harnesses) the pair is
its own, and for priors, pooling and adaptive rounds it counts as one more teacher, `teacher · harness`.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from statistics import NormalDist

from ..schemas.calibration import Calibration, RoundPlan
from ..schemas.common import INFRA_STATUSES
from ..schemas.config import CalibrateConfig
from ..schemas.verdict import Verdict
from .agent.harnesses import episode_harness
from .difficulty import fit_pooled, label_confidence, label_gain
from .difficulty.bands import difficulty_label, label_definitions, label_of_rate
from .engine import Manifest, Shard, ShardResult, Stage, StageContext, upstream_parts
from .envs.catalogue import load_envs

__all__ = ["CalibrateStage", "difficulty_label", "label_certain", "label_confidence", "label_definitions",
           "label_gain", "label_of_rate", "next_rollouts", "wilson_interval"]


def wilson_interval(passes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (Statistical Precipice recommends it over
    the normal approximation at small n). n == 0 gives the uninformative (0, 1)."""
    if n == 0:
        return 0.0, 1.0
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = passes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    lo = 0.0 if passes == 0 else max(0.0, centre - half)
    hi = 1.0 if passes == n else min(1.0, centre + half)
    return lo, hi


def label_certain(lo: float, hi: float, n: int, cfg: CalibrateConfig) -> bool:
    """No band boundary inside the Wilson interval (a boundary exactly at an end belongs to the upper band)."""
    bounds = (cfg.unsolved_below, cfg.medium, cfg.easy, cfg.trivial)
    return n > 0 and not any(lo < b <= hi for b in bounds)


def next_rollouts(counts: list[tuple[int, int]], samples: list[int], cfg: CalibrateConfig, spent: int = 0,
                  groups: list[str] | None = None, confidence: list[float] | None = None,
                  rounds_left: int = 1) -> dict[int, int]:
    """One adaptive round: pair index -> how many more rollouts. `counts`: (passes, attempts) per
    (environment, teacher) pair (attempts 0: unlabelled, never sure, served first); `samples`: how many
    samples the pair's environment has (over teachers); `groups`: each pair's teacher (each teacher's prior
    is fitted to its own pairs); `spent`: rollouts the adaptive rounds already added (against `budget`);
    `confidence`: `label_confidence` per pair, if already computed. A pair gets `batch` more (fewer at
    `max_samples`) unless it is certain (posterior mass on its label >= `confidence`) or its rule calls
    it sure; the unsure get them in order of expected gain while this round's share of the budget lasts
    (what is left over `rounds_left` rounds, this one included, but at least a batch: later rounds see
    the answers first)."""
    a = cfg.adaptive
    if a is None:
        return {}
    groups = groups or [""] * len(counts)
    conf = list(confidence) if confidence is not None else [0.0] * len(counts)
    gain = [math.inf] * len(counts)
    for g in sorted(set(groups)):
        idx = [i for i, x in enumerate(groups) if x == g and counts[i][1] > 0]
        sub = [counts[i] for i in idx]
        if confidence is None:
            for i, v in zip(idx, label_confidence(sub, cfg)):
                conf[i] = v
        if a.rule == "gain" or a.budget is not None:
            for i, v in zip(idx, label_gain(sub, cfg, a.batch)):
                gain[i] = v
    unsure = []
    for i, (s, n) in enumerate(counts):
        if samples[i] >= a.max_samples:
            continue
        if n > 0 and (conf[i] >= cfg.confidence
                      or (a.rule == "gain" and gain[i] < a.min_gain)
                      or (a.rule == "posterior" and conf[i] >= a.target)
                      or (a.rule == "wilson" and label_certain(*wilson_interval(s, n, a.target), n, cfg))):
            continue
        unsure.append(i)
    left = math.inf
    if a.budget is not None:  # this round's share, at least a batch
        left = min(a.budget - spent, max(math.ceil((a.budget - spent) / max(rounds_left, 1)), a.batch))
    out: dict[int, int] = {}
    for i in sorted(unsure, key=lambda i: -gain[i]):  # stable: equal gains keep the pairs' order
        k = min(a.batch, a.max_samples - samples[i])
        if k <= left:
            out[i] = k
            left -= k
    return out


class CalibrateStage(Stage):
    name = "calibrate"
    requires = ("verify", "synthesize")
    config_sections = ("calibrate", "rollout")
    output = Calibration

    def config_section(self, config) -> dict:
        out = super().config_section(config)
        out["rollout"] = {"samples_per_env": config.rollout.samples_per_env}  # the adaptive budget starts there
        return out

    def plan(self, ctx: StageContext, upstream: dict[str, Manifest]) -> list[Shard]:
        return [Shard(index=0)]

    def summarize(self, ctx: StageContext, shard_stats: list[dict]) -> dict:
        """One shard: its round plan and pooled fit are kept whole (summing would drop lists and names)."""
        out = super().summarize(ctx, shard_stats)
        out[RoundPlan.STATS_KEY] = shard_stats[0][RoundPlan.STATS_KEY] if shard_stats else {}
        if shard_stats and "pooled" in shard_stats[0]:
            out["pooled"] = shard_stats[0]["pooled"]
        return out

    def run_shard(self, ctx: StageContext, shard: Shard, upstream: dict[str, Manifest]) -> ShardResult:
        verdicts = ctx.store.read_records(upstream_parts(upstream, "verify"), Verdict)
        envs = load_envs(ctx, upstream["synthesize"], {v.env_id for v in verdicts})
        groups: dict[tuple[str, str, str | None], list[Verdict]] = defaultdict(list)
        for v in verdicts:
            groups[(v.env_id, v.teacher, episode_harness(envs[v.env_id], v.harness))].append(v)
        cfg = ctx.config.calibrate
        pairs = sorted(groups, key=lambda k: (k[0], k[1], k[2] or ""))
        rater = {k: k[1] if k[2] is None else f"{k[1]} · {k[2]}" for k in pairs}  # a teacher in a harness
        counts: dict[tuple[str, str, str | None], tuple[int, int]] = {}
        samples: dict[str, int] = {}  # the next sample number of each environment, over teachers
        for key, vs in groups.items():
            counted = [v for v in vs if v.verified and v.status not in INFRA_STATUSES]
            counts[key] = (sum(v.passed for v in counted), len(counted))
            samples[key[0]] = max(samples.get(key[0], 0), max(v.sample for v in vs) + 1)
        # an environment is known solvable when it has a reference solution or any teacher passed it
        solvable = {e: getattr(envs[e], "oracle", "present") != "absent" for e in samples}
        for (e, _, _), (s, _) in counts.items():
            solvable[e] = solvable[e] or s > 0
        conf: dict[tuple[str, str, str | None], float] = {}
        for teacher in sorted(set(rater.values())):  # each teacher's prior from its own pairs
            keys = [k for k in pairs if rater[k] == teacher and counts[k][1] > 0]
            conf.update(zip(keys, label_confidence([counts[k] for k in keys], cfg)))
        per_env: dict[str, dict[str, tuple[int, int]]] = defaultdict(dict)
        for k, c in counts.items():
            per_env[k[0]][rater[k]] = c
        pooled = fit_pooled(per_env, cfg)
        rows = []
        for key in pairs:
            env_id, teacher, harness = key
            passes, n = counts[key]
            vs = groups[key]
            lo, hi = wilson_interval(passes, n, cfg.confidence)
            label = difficulty_label(passes, n, cfg, solvable[env_id])
            lc = conf.get(key, 0.0)
            if env_id not in pooled.rate:
                p_label, p_rate, p_conf = "unlabelled", 0.0, 0.0
            else:
                p_rate = pooled.rate[env_id]
                p_label = label_of_rate(p_rate, cfg) if solvable[env_id] else "unverified"
                p_conf = pooled.band_mass[env_id].get(label_of_rate(p_rate, cfg), 0.0)
            env = envs[env_id]
            rows.append(Calibration(
                env_id=env_id, family=env.family, level=env.level, teacher=teacher, harness=harness, attempts=n,
                passes=passes,
                excluded=len(vs) - n, solve_rate=passes / n if n else 0.0, ci_low=round(lo, 6),
                ci_high=round(hi, 6), label=label, label_confidence=round(lc, 6),
                certain=lc >= cfg.confidence and label not in ("unverified", "unlabelled"),
                hacks=sum(bool(v.hack_flags) and v.verified and v.status not in INFRA_STATUSES for v in vs),
                pooled_label=p_label, pooled_solve_rate=p_rate, pooled_confidence=round(p_conf, 6),
                pooled_teacher=pooled.reference))
        needs_more, next_sample, unsure, unsure_harnesses = {}, {}, {}, {}
        spent = 0
        if cfg.adaptive:
            first = {t.label: t.samples_per_env or ctx.config.rollout.samples_per_env for t in ctx.config.teachers}
            spent = sum(v.sample >= first.get(v.teacher, ctx.config.rollout.samples_per_env) for v in verdicts)
            done = sum(name.split(".")[0] == "verify" for name in upstream) - 1  # adaptive rounds so far
            more = next_rollouts([counts[k] for k in pairs], [samples[k[0]] for k in pairs], cfg, spent,
                                 groups=[rater[k] for k in pairs], confidence=[conf.get(k, 0.0) for k in pairs],
                                 rounds_left=cfg.adaptive.max_rounds - done)
            for i, k in sorted(more.items()):
                env_id, teacher, harness = pairs[i]
                needs_more[env_id], next_sample[env_id] = k, samples[env_id]
                unsure.setdefault(env_id, []).append(teacher)
                unsure_harnesses.setdefault(env_id, []).append(harness)
        plan = RoundPlan(needs_more=needs_more, next_sample=next_sample, unsure_teachers=unsure,
                         unsure_harnesses=unsure_harnesses if any(k[2] for k in pairs) else {})  # a one-harness build: as before
        stats = {"labels": dict(Counter(r.label for r in rows)), "environments": len(rows),
                 "pooled_labels": dict(Counter(r.pooled_label for r in {r.env_id: r for r in rows}.values())),
                 "certain": sum(r.certain for r in rows), "attempts": sum(r.attempts for r in rows),
                 "adaptive_rollouts": spent, "pooled": {"reference": pooled.reference, "ability": pooled.ability},
                 RoundPlan.STATS_KEY: plan.model_dump(mode="json")}
        return ShardResult(rows, [], stats)
