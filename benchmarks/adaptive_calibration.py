"""Benchmark `adaptive_calibration` (issues 5 and 14; target: rollouts used by adaptive calibration ÷ fixed
k at equal label accuracy ≤ 0.6, on both populations, under the issue-14 label definitions).

Simulated populations of environments with known solve rates; each rollout is a Bernoulli draw. The
decisions are the product's own code (tasks/calibrate.py): `difficulty_label` for labels and
`next_rollouts` for "who gets how many more" (a pair stops once its label is certain, i.e. the
posterior puts `calibrate.confidence` on its band: 0 of n stops once P(p < unsolved_below) is that high;
else by its rule: `gain`, the default, = expected rise in P(label right) per extra rollout under the
empirical-Bayes prior, `posterior`, or the Wilson interval `wilson`; with a `budget`, the highest gains
first until it is spent). Adaptive rounds run as the flow runs them. Fixed k gives every environment k
rollouts. Accuracy = share of environments whose label equals the band of their true rate, under each
set of definitions: `new` (unsolved p < 0.02, trivial p >= 0.98: the defaults), `new, trivial 0.9`
(only the bottom band changed), `old` (unsolved p == 0, trivial p >= 0.9: before issue 14). For each
adaptive setting: the smallest fixed k at least as accurate (the fixed-k curve is its exact expected
accuracy, so sampling noise does not pick a lucky k), and the ratio of rollouts used (accuracy and rollouts of each adaptive
setting are the mean of `--repeats` runs with different rollout draws). For scale, the last
column is the ratio of an allocation that is *told* which environments are deterministic (p = 0 or 1:
k0 rollouts each, always labelled right) and gives the others the same fixed k: what skipping the sure
environments alone can save on that population.

The first row of each table is the shipped defaults (`calibrate.adaptive: {}`: `AdaptiveConfig()`, k0 =
`rollout.samples_per_env`'s default): the target is judged there, under the default (`new`) definitions, on
both populations; the other rows are tuned settings for comparison.

`--sweep` replaces the settings by a grid around the defaults (k0 = the default `samples_per_env`; min_gain,
batch, max_samples, max_rounds varied): how the shipped defaults were chosen (issue 28 item 3).

Usage: python benchmarks/adaptive_calibration.py [--envs 2000] [--seed 7] [--repeats 3] [--definitions new old]
       [--quick] [--sweep]
"""

from __future__ import annotations

import argparse
import random
import sys
from math import comb
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import add_quick, host_report, print_table, target  # noqa: E402

from trajforge.schemas.config import AdaptiveConfig, CalibrateConfig, RolloutConfig  # noqa: E402
from trajforge.tasks.calibrate import difficulty_label, label_of_rate, next_rollouts  # noqa: E402
from trajforge.tasks.difficulty.posterior import loglik  # noqa: E402

DEFINITIONS = {  # issue 14: unsolved = p < 0.02 and trivial = p >= 0.98 (the defaults); before it: p == 0, p >= 0.9
    "new": CalibrateConfig(),
    "new, trivial 0.9": CalibrateConfig(trivial=0.9),  # what the symmetric top band costs
    "old": CalibrateConfig(unsolved_below=0.0, trivial=0.9),
}
POPULATIONS = {
    "u-shaped (35% never solved, 15% always, 50% Beta(0.5,0.5))":
        lambda r: 0.0 if (u := r.random()) < 0.35 else 1.0 if u < 0.5 else r.betavariate(0.5, 0.5),
    "spread (30% never, 10% always, 60% uniform)":
        lambda r: 0.0 if (u := r.random()) < 0.3 else 1.0 if u < 0.4 else r.random(),
}
# (rule, threshold, k0, batch, max_samples, budget per environment or None, max_rounds); the first: the defaults
_D = AdaptiveConfig()
DEFAULTS = (_D.rule, _D.min_gain if _D.rule == "gain" else _D.target, RolloutConfig.model_fields["samples_per_env"].default,
            _D.batch, _D.max_samples, _D.budget, _D.max_rounds)
SETTINGS = [DEFAULTS] + [(*s, 30) for s in [("gain", 0.01, 4, 2, 48, None), ("gain", 0.005, 4, 2, 64, None), ("gain", 0.003, 4, 4, 80, None),
            ("gain", 0.002, 4, 4, 96, None), ("gain", 0.001, 4, 4, 160, None), ("gain", 0.0005, 4, 8, 200, None),
            ("gain", 0.001, 4, 4, 160, 14), ("posterior", 0.9, 4, 2, 32, None), ("posterior", 0.95, 3, 3, 64, None),
            ("wilson", 0.95, 4, 2, 32, None)]]


def sweep_settings() -> list[tuple]:
    """A grid around the defaults, the defaults first (the target line still judges them)."""
    k0 = DEFAULTS[2]
    return [DEFAULTS] + [("gain", g, k0, b, m, None, r) for g in (0.02, 0.01, 0.005, 0.002) for b in (2, 4)
                         for m in (16, 24, 32) for r in (4, 6, 8) if k0 + b * r >= m]


def accuracy(cfg: CalibrateConfig, rates: list[float], passes: list[int], attempts: list[int]) -> float:
    return sum(difficulty_label(s, n, cfg) == label_of_rate(p, cfg)
               for p, s, n in zip(rates, passes, attempts)) / len(rates)


def fixed(cfg: CalibrateConfig, rates: list[float], k: int) -> float:
    """Expected accuracy of k rollouts each, exactly (a sum over the binomial outcomes: no sampling noise)."""
    p = np.array(rates)[:, None]
    s = np.arange(k + 1)[None, :]
    pmf = np.array([comb(k, int(x)) for x in s[0]], dtype=float)[None, :] * np.exp(loglik(s, k, p))
    right = (np.array([label_of_rate(r, cfg) for r in rates])[:, None]
             == np.array([difficulty_label(int(x), k, cfg) for x in s[0]])[None, :])
    return float((pmf * right).sum(axis=1).mean())


def adaptive(cfg: CalibrateConfig, rates: list[float], k0: int, rng: random.Random) -> tuple[float, float, int, str]:
    """Rounds as the flow runs them (at most `adaptive.max_rounds`): the stage's own `next_rollouts` decides who
    gets how many more."""
    max_rounds = cfg.adaptive.max_rounds
    passes = [sum(rng.random() < p for _ in range(k0)) for p in rates]
    attempts = [k0] * len(rates)
    rounds = 0
    for rounds in range(1, max_rounds + 1):
        more = next_rollouts(list(zip(passes, attempts)), attempts, cfg, spent=sum(attempts) - k0 * len(rates),
                             rounds_left=max_rounds - rounds + 1)
        if not more:
            break
        for i, k in more.items():
            passes[i] += sum(rng.random() < rates[i] for _ in range(k))
            attempts[i] += k
    split = {"p=0": [], "0<p<1": [], "p=1": []}  # where the rollouts went, by true rate
    for p, n in zip(rates, attempts):
        split["p=0" if p == 0 else "p=1" if p == 1 else "0<p<1"].append(n)
    where = " / ".join(f"{sum(v) / len(v):.0f}" for v in split.values() if v)
    return accuracy(cfg, rates, passes, attempts), sum(attempts) / len(rates), rounds, where


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--envs", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--repeats", type=int, default=3, help="adaptive runs averaged per setting (rollout draws)")
    ap.add_argument("--definitions", nargs="+", default=list(DEFINITIONS), choices=list(DEFINITIONS),
                    help="label definitions to measure under (default: all)")
    ap.add_argument("--sweep", action="store_true", help="a grid of `gain` settings around the defaults instead")
    add_quick(ap, "--envs 300 --repeats 1, the defaults and two tuned settings, `new` definitions")
    args = ap.parse_args()
    settings = sweep_settings() if args.sweep else SETTINGS
    if args.quick:
        args.envs, args.repeats, args.definitions, settings = 300, 1, ["new"], SETTINGS[:3]
    host_report("start", args.quick)
    codes = []
    for name, draw in POPULATIONS.items():
        rng = random.Random(args.seed)
        rates = [draw(rng) for _ in range(args.envs)]
        det = sum(p in (0.0, 1.0) for p in rates) / len(rates)
        for definition in args.definitions:
            base = DEFINITIONS[definition]
            curve = [(k, fixed(base, rates, k)) for k in range(2, 81)]
            rows = []
            for n, (rule, threshold, k0, batch, max_samples, budget, max_rounds) in enumerate(settings):
                thresholds = {"min_gain": threshold} if rule == "gain" else {"target": threshold}
                cfg = base.model_copy(update={"adaptive": AdaptiveConfig(
                    rule=rule, batch=batch, max_samples=max_samples, max_rounds=max_rounds,
                    budget=budget * args.envs if budget else None, **thresholds)})
                runs = [adaptive(cfg, rates, k0, random.Random(args.seed + 99 + r)) for r in range(args.repeats)]
                acc, used = (sum(x[i] for x in runs) / len(runs) for i in (0, 1))
                rounds, where = max(x[2] for x in runs), runs[0][3]
                k, a = next(((k, a) for k, a in curve if a >= acc), (None, None))
                # reference: an allocation told which environments are deterministic (p = 0 or 1, always
                # labelled right from k0 rollouts) that gives k0 to those and the fixed k to the rest
                oracle = f"{(det * k0 + (1 - det) * k) / k:.2f}" if k else "-"
                setting = ("defaults: " if n == 0 else "") + f"{rule} {threshold} k0={k0} batch={batch} " \
                    f"max={max_samples} rounds={max_rounds}"
                if n == 0 and definition == "new":
                    codes.append(target(f"adaptive ÷ fixed k at equal accuracy, defaults, {name.split(' (')[0]}",
                                        used / k if k else float("nan"), "<=", 0.6, args.quick,
                                        peer=f"fixed k={k if k else '> 80'} at accuracy {a or 0:.3f} vs {acc:.3f}"))
                rows.append([setting + (f" budget={budget}/env" if budget else ""), f"{acc:.3f}",
                             f"{used:.1f}", where, str(rounds), str(k) if k else "> 80", f"{a:.3f}" if a else "-",
                             f"{used / k:.2f}" if k else "< " + f"{used / 80:.2f}", oracle])
            print_table(f"adaptive_calibration · {args.envs} environments · {name} · {definition} definitions",
                        ["adaptive setting", "accuracy", "rollouts/env", "p=0 / 0<p<1 / p=1", "rounds",
                         "fixed k at ≥ accuracy", "its accuracy", "ratio (target ≤ 0.6)", "p∈{0,1}-oracle ratio"],
                        rows)
            print(f"fixed-k accuracy ({definition}): " + ", ".join(f"k={k}: {a:.3f}" for k, a in curve[::8]))
    host_report("end")
    return max(codes, default=0)


if __name__ == "__main__":
    sys.exit(main())
