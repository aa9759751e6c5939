"""Stage `calibrate`: solve rate per (environment, teacher) with a Wilson score interval, a difficulty
label and whether the label is certain. Infrastructure/teacher errors and unverified rows are excluded
from the counts (reported in `excluded`); hack-flagged rollouts count as attempts, never as passes.
A pair with no counted attempt is `unlabelled`, never `unsolved`; the adaptive planner asks for more
samples of it (like any unsure label, within `max_samples`).

Adaptive rounds (`calibrate.adaptive`): the stage also decides which environments need more
rollouts: those whose label is worth more rollouts (by default: `batch` more are expected to raise the
empirical-Bayes probability that the label is right by `min_gain` per rollout) and that have fewer
than `max_samples` attempts get `batch` more. The decision is a typed `RoundPlan` in the manifest's stats;
the flow runs another rollout -> verify -> calibrate round for exactly those.
"""

from __future__ import annotations

import math
from collections import defaultdict
from statistics import NormalDist

from ..schemas.calibration import Calibration, Label, RoundPlan
from ..schemas.common import INFRA_STATUSES
from ..schemas.config import CalibrateConfig
from ..schemas.verdict import Verdict
from .engine import Manifest, Shard, ShardResult, Stage, StageContext, upstream_parts
from .envs.catalogue import load_envs


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


def difficulty_label(passes: int, n: int, cfg: CalibrateConfig) -> Label:
    """No counted attempt is `unlabelled` (nothing is known), never `unsolved` (0 passes of n > 0)."""
    if n == 0:
        return "unlabelled"
    if passes == 0:
        return "unsolved"
    p = passes / n
    if p >= cfg.trivial:
        return "trivial"
    if p >= cfg.easy:
        return "easy"
    if p >= cfg.medium:
        return "medium"
    return "hard"


def label_certain(lo: float, hi: float, n: int, cfg: CalibrateConfig) -> bool:
    """No boundary inside the interval (a boundary exactly at an end belongs to the upper label)."""
    return n > 0 and not any(lo < b <= hi for b in (cfg.medium, cfg.easy, cfg.trivial))


GRID = [i / 50 for i in range(51)]  # solve rates the empirical-Bayes prior lives on (0 and 1 included)


def label_of_rate(p: float, cfg: CalibrateConfig) -> Label:
    if p == 0:
        return "unsolved"
    return "trivial" if p >= cfg.trivial else "easy" if p >= cfg.easy else "medium" if p >= cfg.medium else "hard"


def _posterior(counts: list[tuple[int, int]], iters: int = 300):
    """Posterior over GRID for each (passes, attempts), under a prior fitted by EM to all of them
    (nonparametric empirical Bayes). A pseudo-count per grid point keeps a small build from trusting
    a prior fitted to a handful of environments."""
    import numpy as np

    grid = np.array(GRID)
    s = np.array([c[0] for c in counts], dtype=float)[:, None]
    n = np.array([c[1] for c in counts], dtype=float)[:, None]
    like = grid[None, :] ** s * (1 - grid[None, :]) ** (n - s)
    prior = np.full(len(GRID), 1 / len(GRID))
    for _ in range(iters):  # EM, with one pseudo-environment per grid point (few environments: ~uniform prior)
        post = like * prior
        post /= post.sum(axis=1, keepdims=True)
        prior = (post.sum(axis=0) + 1.0) / (len(counts) + len(GRID))
    post = like * prior
    return grid, post / post.sum(axis=1, keepdims=True)


def _label_of_grid(cfg: CalibrateConfig):
    """The label of each GRID rate, as an array to compare a label against."""
    import numpy as np

    return np.array([label_of_rate(p, cfg) for p in GRID])


def _mass_of_label(post_row, of_grid, passes: int, attempts: int, cfg: CalibrateConfig) -> float:
    """Posterior mass on the rates whose label is the point-estimate label of (passes, attempts)."""
    return float(post_row[of_grid == difficulty_label(passes, attempts, cfg)].sum())


def label_confidence(counts: list[tuple[int, int]], cfg: CalibrateConfig) -> list[float]:
    """P(the point-estimate label is the label of the true rate | passes, attempts) for each environment,
    under the empirical-Bayes prior (many unsolved environments make 0/4 convincing; a spread
    population makes it less so)."""
    if not counts:
        return []
    _, post = _posterior(counts)
    of_grid = _label_of_grid(cfg)
    return [_mass_of_label(post[i], of_grid, s, n, cfg) for i, (s, n) in enumerate(counts)]


def label_gain(counts: list[tuple[int, int]], cfg: CalibrateConfig, batch: int,
               horizons: tuple[int, ...] = (1, 2, 4)) -> list[float]:
    """Expected gain in P(label right) per extra rollout, for each environment: for h batches more
    (h in `horizons`), the posterior predictive over their passes times the confidence of the label
    they would give, minus today's confidence, divided by the rollouts spent; the best h counts (a
    label that one batch cannot move may be moved by four). Sure labels gain ~0, and so do labels
    sitting on a boundary that no affordable number of rollouts would settle: the rule spends
    rollouts where they buy accuracy (knowledge gradient)."""
    from math import comb

    if not counts:
        return []
    grid, post = _posterior(counts)
    of_grid = _label_of_grid(cfg)
    first = {}  # environments with the same counts have the same posterior: compute each once
    for i, c in enumerate(counts):
        first.setdefault(c, i)
    gain = {}
    for (s, n), i in first.items():
        now = _mass_of_label(post[i], of_grid, s, n, cfg)
        best = 0.0
        for h in horizons:
            m = h * batch
            expected = sum(_mass_of_label(post[i] * comb(m, k) * grid ** k * (1 - grid) ** (m - k), of_grid,
                                          s + k, n + m, cfg)
                           for k in range(m + 1))  # k passes among m more rollouts
            best = max(best, (expected - now) / m)
        gain[(s, n)] = best
    return [gain[c] for c in counts]


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
        """One shard: its round plan is kept whole (summing would drop the teacher lists)."""
        out = super().summarize(ctx, shard_stats)
        out[RoundPlan.STATS_KEY] = shard_stats[0][RoundPlan.STATS_KEY] if shard_stats else {}
        return out

    def run_shard(self, ctx: StageContext, shard: Shard, upstream: dict[str, Manifest]) -> ShardResult:
        verdicts = ctx.store.read_records(upstream_parts(upstream, "verify"), Verdict)
        envs = load_envs(ctx, upstream["synthesize"], {v.env_id for v in verdicts})
        groups: dict[tuple[str, str], list[Verdict]] = defaultdict(list)
        for v in verdicts:
            groups[(v.env_id, v.teacher)].append(v)
        cfg = ctx.config.calibrate
        rows, needs_more, next_sample, samples, unsure = [], {}, {}, {}, {}
        for (env_id, teacher), vs in sorted(groups.items()):
            counted = [v for v in vs if v.verified and v.status not in INFRA_STATUSES]
            passes = sum(v.passed for v in counted)
            n = len(counted)
            lo, hi = wilson_interval(passes, n, cfg.confidence)
            certain = label_certain(lo, hi, n, cfg)
            env = envs[env_id]
            rows.append(Calibration(env_id=env_id, family=env.family, level=env.level, teacher=teacher,
                                    attempts=n, passes=passes, excluded=len(vs) - n,
                                    solve_rate=passes / n if n else 0.0, ci_low=round(lo, 6), ci_high=round(hi, 6),
                                    label=difficulty_label(passes, n, cfg), certain=certain,
                                    hacks=sum(bool(v.hack_flags) for v in counted)))
            samples[env_id] = max(samples.get(env_id, 0), max(v.sample for v in vs) + 1)  # over teachers
        a = cfg.adaptive
        if a:
            # an unlabelled pair is never sure: it asks for `batch` more samples (within max_samples);
            # the prior is fitted to the labelled pairs only (no attempt carries no evidence)
            labelled = [r for r in rows if r.attempts]
            counts = [(r.passes, r.attempts) for r in labelled]
            if a.rule == "gain":
                sure_l = [g < a.min_gain for g in label_gain(counts, cfg, a.batch)]
            elif a.rule == "posterior":
                sure_l = [c >= a.target for c in label_confidence(counts, cfg)]
            else:
                sure_l = [label_certain(*wilson_interval(r.passes, r.attempts, a.target), r.attempts, cfg)
                          for r in labelled]
            by_pair = {(r.env_id, r.teacher): ok for r, ok in zip(labelled, sure_l)}
            sure = [by_pair.get((r.env_id, r.teacher), False) for r in rows]
            for r, ok in zip(rows, sure):
                if not ok and samples[r.env_id] < a.max_samples:
                    needs_more[r.env_id] = min(a.batch, a.max_samples - samples[r.env_id])
                    next_sample[r.env_id] = samples[r.env_id]
                    unsure.setdefault(r.env_id, []).append(r.teacher)
        labels: dict[str, int] = {}
        for r in rows:
            labels[r.label] = labels.get(r.label, 0) + 1
        plan = RoundPlan(needs_more=needs_more, next_sample=next_sample, unsure_teachers=unsure)
        stats = {"labels": labels, "environments": len(rows), "certain": sum(r.certain for r in rows),
                 "attempts": sum(r.attempts for r in rows), RoundPlan.STATS_KEY: plan.model_dump(mode="json")}
        return ShardResult(rows, [], stats)
