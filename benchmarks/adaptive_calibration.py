"""Benchmark `adaptive_calibration` (issue 5; target: rollouts used by adaptive calibration ÷ fixed k at
equal label accuracy ≤ 0.6).

Simulated populations of environments with known solve rates; each rollout is a Bernoulli draw. The
decisions are the product's own code (tasks/calibrate.py): `difficulty_label` for labels,
`label_gain` (rule `gain`, the default: expected rise in P(label right) per extra rollout, under the
empirical-Bayes prior), `label_confidence` (rule `posterior`) or the Wilson interval (rule `wilson`)
for "more rollouts?". Adaptive rounds run as the flow runs them: every round, calibration looks at
all environments and gives `batch` more rollouts to the unsure ones, up to `max_samples`. Fixed k gives
every environment k rollouts. Accuracy = share of environments whose label equals the label of their
true rate. For each adaptive setting: the smallest fixed k at least as accurate (the fixed-k curve is
averaged over 3 draws per k, so sampling noise does not pick a lucky k), and the ratio of rollouts used.
For scale, the last column is the ratio of an allocation that is *told* which environments are
deterministic (p = 0 or 1: k0 rollouts each, always labelled right) and gives the others the same
fixed k: what skipping the sure environments alone can save on that population.

Usage: python benchmarks/adaptive_calibration.py [--envs 2000] [--seed 7]
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import print_table  # noqa: E402

from trajforge.schemas.config import CalibrateConfig  # noqa: E402
from trajforge.tasks.calibrate import (  # noqa: E402
    difficulty_label,
    label_certain,
    label_confidence,
    label_gain,
    label_of_rate,
    wilson_interval,
)

CFG = CalibrateConfig()
POPULATIONS = {
    "u-shaped (35% never solved, 15% always, 50% Beta(0.5,0.5))":
        lambda r: 0.0 if (u := r.random()) < 0.35 else 1.0 if u < 0.5 else r.betavariate(0.5, 0.5),
    "spread (30% never, 10% always, 60% uniform)":
        lambda r: 0.0 if (u := r.random()) < 0.3 else 1.0 if u < 0.4 else r.random(),
}


def accuracy(rates: list[float], passes: list[int], attempts: list[int]) -> float:
    return sum(difficulty_label(s, n, CFG) == label_of_rate(p, CFG)
               for p, s, n in zip(rates, passes, attempts)) / len(rates)


def fixed(rates: list[float], k: int, seed: int, draws: int = 3) -> float:
    total = 0.0
    for d in range(draws):
        rng = random.Random(seed * 1000 + d)
        total += accuracy(rates, [sum(rng.random() < p for _ in range(k)) for p in rates], [k] * len(rates))
    return total / draws


def adaptive(rates: list[float], k0: int, batch: int, max_samples: int, rule: str, target: float,
             rng: random.Random, max_rounds: int = 30) -> tuple[float, float, int, str]:
    passes = [sum(rng.random() < p for _ in range(k0)) for p in rates]
    attempts = [k0] * len(rates)
    rounds = 0
    for rounds in range(1, max_rounds + 1):
        if rule == "gain":
            sure = [g < target for g in label_gain(list(zip(passes, attempts)), CFG, batch)]
        elif rule == "posterior":
            sure = [c >= target for c in label_confidence(list(zip(passes, attempts)), CFG)]
        else:
            sure = [label_certain(*wilson_interval(s, n, target), n, CFG) for s, n in zip(passes, attempts)]
        more = [i for i, ok in enumerate(sure) if not ok and attempts[i] < max_samples]
        if not more:
            break
        for i in more:
            k = min(batch, max_samples - attempts[i])
            passes[i] += sum(rng.random() < rates[i] for _ in range(k))
            attempts[i] += k
    split = {"p=0": [], "0<p<1": [], "p=1": []}  # where the rollouts went, by true rate
    for p, n in zip(rates, attempts):
        split["p=0" if p == 0 else "p=1" if p == 1 else "0<p<1"].append(n)
    where = " / ".join(f"{sum(v) / len(v):.0f}" for v in split.values() if v)
    return accuracy(rates, passes, attempts), sum(attempts) / len(rates), rounds, where


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--envs", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    for name, draw in POPULATIONS.items():
        rng = random.Random(args.seed)
        rates = [draw(rng) for _ in range(args.envs)]
        curve = [(k, fixed(rates, k, args.seed + k)) for k in range(2, 81)]
        rows = []
        for rule, target, k0, batch, max_samples in [("gain", 0.01, 4, 2, 48), ("gain", 0.005, 4, 2, 64),
                                                     ("gain", 0.003, 4, 4, 80), ("gain", 0.002, 4, 4, 96),
                                                     ("posterior", 0.9, 4, 2, 32), ("posterior", 0.95, 3, 3, 64),
                                                     ("wilson", 0.95, 4, 2, 32)]:
            acc, used, rounds, where = adaptive(rates, k0, batch, max_samples, rule, target, random.Random(args.seed + 99))
            k, a = next(((k, a) for k, a in curve if a >= acc), (None, None))
            # reference: an allocation told which environments are deterministic (p = 0 or 1, always
            # labelled right from k0 rollouts) that gives k0 to those and the fixed k to the rest
            det = sum(p in (0.0, 1.0) for p in rates) / len(rates)
            oracle = f"{(det * k0 + (1 - det) * k) / k:.2f}" if k else "-"
            rows.append([f"{rule} {target} k0={k0} batch={batch} max={max_samples}", f"{acc:.3f}", f"{used:.1f}",
                         where, str(rounds), str(k) if k else "> 80", f"{a:.3f}" if a else "-",
                         f"{used / k:.2f}" if k else "< " + f"{used / 80:.2f}", oracle])
        print_table(f"adaptive_calibration · {args.envs} environments · {name}",
                    ["adaptive setting", "accuracy", "rollouts/env", "p=0 / 0<p<1 / p=1", "rounds", "fixed k at ≥ accuracy",
                     "its accuracy", "ratio (target ≤ 0.6)", "p∈{0,1}-oracle ratio"], rows)
        print("fixed-k accuracy: " + ", ".join(f"k={k}: {a:.3f}" for k, a in curve[::8]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
