"""One difficulty per environment across teachers: a joint fit of a per-teacher ability and a
per-environment solve rate (a Rasch-type model with an empirical-Bayes prior over the rate).

Model: teacher t solves environment e with probability sigmoid(logit(p_e) + a_t), where p_e is the rate
of the reference teacher (a_ref = 0) and lives on the rate grid under a prior fitted to all environments;
rates 0 and 1 stay 0 and 1 for every teacher. EM alternates the posteriors over p_e, the prior, and a
Newton step on each other teacher's ability a_t (clipped to +-10). The reference is the named teacher,
else the strongest by fitted ability (a first fit against the teacher with the most attempts finds it).
A teacher with no counted attempt takes no part. One teacher: the pooled rate is passes/attempts."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...schemas.config import CalibrateConfig
from .posterior import PSEUDO_ENVIRONMENTS, band_labels, loglik, normalise, rate_grid

MAX_ABILITY = 10.0


@dataclass
class PooledFit:
    """Per environment (keys of `counts`): the reference teacher's fitted rate (maximum likelihood given
    every teacher's attempts), and the posterior over it as mass per band (`band_mass`)."""

    reference: str
    ability: dict[str, float]
    rate: dict[str, float] = field(default_factory=dict)
    band_mass: dict[str, dict[str, float]] = field(default_factory=dict)


def _teacher_rates(grid_logit: np.ndarray, ability: np.ndarray) -> np.ndarray:
    """teachers x grid solve probabilities (0 and 1 exact)."""
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-(grid_logit[None, :] + ability[:, None])))


def _fit(S: np.ndarray, N: np.ndarray, w: np.ndarray, grid: np.ndarray, ref: int, iters: int):
    t_count = S.shape[1]
    with np.errstate(divide="ignore"):
        glogit = np.log(grid) - np.log1p(-grid)
    ability = np.zeros(t_count)
    prior = np.full(len(grid), 1 / len(grid))
    post = None
    for _ in range(iters):
        P = _teacher_rates(glogit, ability)
        ll = sum(loglik(S[:, t:t + 1], N[:, t:t + 1], P[t][None, :]) for t in range(t_count))
        post = normalise(ll + np.log(prior))
        prior = (w @ post + PSEUDO_ENVIRONMENTS / len(grid)) / (w.sum() + PSEUDO_ENVIRONMENTS)
        for t in range(t_count):
            if t == ref:
                continue
            grad = float(w @ (S[:, t] - N[:, t] * (post @ P[t])))
            hess = float(w @ (N[:, t] * (post @ (P[t] * (1 - P[t])))))
            if hess > 1e-9:
                ability[t] = np.clip(ability[t] + np.clip(grad / hess, -1.0, 1.0), -MAX_ABILITY, MAX_ABILITY)
            elif grad:  # every attempt at a rate of 0 or 1: move towards the side the passes say
                ability[t] = np.clip(ability[t] + np.sign(grad), -MAX_ABILITY, MAX_ABILITY)
    P = _teacher_rates(glogit, ability)
    ll = sum(loglik(S[:, t:t + 1], N[:, t:t + 1], P[t][None, :]) for t in range(t_count))
    return ability, normalise(ll + np.log(prior))


def _mle_rate(s: np.ndarray, n: np.ndarray, ability: np.ndarray) -> float:
    """The reference rate that maximises the likelihood of one environment's counts (bisection on the
    logit: the score sum(s - n * sigmoid(x + a)) falls in x)."""
    if s.sum() == 0:
        return 0.0
    if (s == n).all():
        return 1.0
    lo, hi = -60.0, 60.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if float((s - n / (1 + np.exp(-(mid + ability)))).sum()) > 0:
            lo = mid
        else:
            hi = mid
    return round(float(1 / (1 + np.exp(-(lo + hi) / 2))), 12)


def fit_pooled(counts: dict[str, dict[str, tuple[int, int]]], cfg: CalibrateConfig,
               iters: int = 60) -> PooledFit:
    """`counts`: environment -> teacher -> (passes, attempts). Environments without any attempt get no
    rate (their pooled label is `unlabelled`)."""
    teachers = sorted({t for per in counts.values() for t, (_, n) in per.items() if n > 0})
    if cfg.pooled_reference is not None and cfg.pooled_reference not in teachers:
        raise ValueError(f"calibrate.pooled_reference: {cfg.pooled_reference!r} has no counted attempt "
                         f"(teachers with attempts: {', '.join(teachers) or 'none'})")
    envs = [e for e, per in counts.items() if any(n for _, n in per.values())]
    if not teachers or not envs:
        return PooledFit(reference=cfg.pooled_reference or "", ability={})
    S = np.array([[counts[e].get(t, (0, 0))[0] for t in teachers] for e in envs], dtype=float)
    N = np.array([[counts[e].get(t, (0, 0))[1] for t in teachers] for e in envs], dtype=float)
    rows, at, w = np.unique(np.hstack([S, N]), axis=0, return_inverse=True, return_counts=True)
    at = at.reshape(-1)
    Su, Nu, w = rows[:, :len(teachers)], rows[:, len(teachers):], w.astype(float)
    grid = rate_grid(cfg)
    if cfg.pooled_reference is not None:
        ref = teachers.index(cfg.pooled_reference)
    else:
        ref = int(np.argmax(N.sum(axis=0)))
        if len(teachers) > 1:
            ability, _ = _fit(Su, Nu, w, grid, ref, iters // 2)  # only the order of abilities matters here
            ref = int(np.argmax(ability))
    ability, post = _fit(Su, Nu, w, grid, ref, iters)
    bands = band_labels(grid, cfg)
    names = sorted(set(bands))
    mass = post @ (bands[:, None] == np.array(names)[None, :]).astype(float)
    fit = PooledFit(reference=teachers[ref], ability={t: round(float(a), 4) for t, a in zip(teachers, ability)})
    rates = [_mle_rate(Su[i], Nu[i], ability) for i in range(len(rows))]
    for e, i in zip(envs, at):
        fit.rate[e] = rates[i]
        fit.band_mass[e] = {b: float(mass[i, j]) for j, b in enumerate(names)}
    return fit
