"""Posteriors over a teacher's solve rate on a grid, under a prior fitted to all of the build's
(passes, attempts) counts by EM (nonparametric empirical Bayes). Pairs with equal counts share a
posterior, so the work scales with the distinct counts, not with the environments.

Invariants: the grid holds 0 and 1 and at least four rates inside each end band (`unsolved`,
`trivial`), so "p < unsolved_below" has posterior mass to put; a label's confidence is the posterior
mass on the grid rates of its band."""

from __future__ import annotations

from math import comb

import numpy as np

from ...schemas.config import CalibrateConfig
from .bands import difficulty_label, label_of_rate

PSEUDO_ENVIRONMENTS = 50.0  # spread over the grid: a build of a handful of environments keeps a ~uniform prior


def rate_grid(cfg: CalibrateConfig) -> np.ndarray:
    """Solve rates the prior lives on: steps of 0.005 plus four rates inside each end band."""
    eps = cfg.unsolved_below
    points = {round(i / 200, 12) for i in range(201)}
    points |= {round(eps * j / 4, 12) for j in range(4)} | {round(1 - eps * j / 4, 12) for j in range(4)}
    return np.array(sorted(points))


def band_labels(grid: np.ndarray, cfg: CalibrateConfig) -> np.ndarray:
    return np.array([label_of_rate(float(p), cfg) for p in grid])


def loglik(passes: np.ndarray, attempts: np.ndarray, p: np.ndarray) -> np.ndarray:
    """log P(passes | attempts, rate) for rows of counts against rates `p` (broadcast; 0 and 1 exact)."""
    fails = attempts - passes
    with np.errstate(divide="ignore", invalid="ignore"):
        return (np.where(passes > 0, passes * np.log(p), 0.0)
                + np.where(fails > 0, fails * np.log1p(-p), 0.0))


def normalise(logpost: np.ndarray) -> np.ndarray:
    post = np.exp(logpost - logpost.max(axis=-1, keepdims=True))
    return post / post.sum(axis=-1, keepdims=True)


def fit_prior(ll: np.ndarray, weights: np.ndarray, iters: int = 300) -> np.ndarray:
    """EM for the prior over the grid given per-row log-likelihoods `ll` (rows x grid) and row weights."""
    g = ll.shape[1]
    like = np.exp(ll - ll.max(axis=1, keepdims=True))
    prior = np.full(g, 1 / g)
    for _ in range(iters):
        post = like * prior
        post /= post.sum(axis=1, keepdims=True)
        prior = (weights @ post + PSEUDO_ENVIRONMENTS / g) / (weights.sum() + PSEUDO_ENVIRONMENTS)
    return prior


def _distinct(counts: list[tuple[int, int]]) -> tuple[list[tuple[int, int]], np.ndarray, list[int]]:
    index: dict[tuple[int, int], int] = {}
    at = [index.setdefault(c, len(index)) for c in counts]
    weights = np.bincount(at, minlength=len(index)).astype(float)
    return list(index), weights, at


def posteriors(counts: list[tuple[int, int]], cfg: CalibrateConfig):
    """(grid, distinct counts, their posteriors, index of each count among the distinct ones)."""
    grid = rate_grid(cfg)
    distinct, weights, at = _distinct(counts)
    s = np.array([c[0] for c in distinct], dtype=float)[:, None]
    n = np.array([c[1] for c in distinct], dtype=float)[:, None]
    ll = loglik(s, n, grid[None, :])
    prior = fit_prior(ll, weights)
    return grid, distinct, normalise(ll + np.log(prior)), at


def label_confidence(counts: list[tuple[int, int]], cfg: CalibrateConfig) -> list[float]:
    """P(the band of the true rate is the band of passes/attempts | counts) for each (passes, attempts > 0)."""
    if not counts:
        return []
    grid, distinct, post, at = posteriors(counts, cfg)
    bands = band_labels(grid, cfg)
    conf = [float(post[i][bands == difficulty_label(s, n, cfg)].sum()) for i, (s, n) in enumerate(distinct)]
    return [conf[i] for i in at]


def label_gain(counts: list[tuple[int, int]], cfg: CalibrateConfig, batch: int,
               horizons: tuple[int, ...] = (1, 2, 4)) -> list[float]:
    """Expected gain in P(label right) per extra rollout, for each (passes, attempts > 0): for h batches
    more (h in `horizons`), the posterior predictive over their passes times the confidence of the label
    they would give, minus today's confidence, divided by the rollouts spent; the best h counts (a label
    one batch cannot move may be moved by four). Sure labels gain ~0, and so do labels on a boundary that
    no affordable number of rollouts would settle (knowledge gradient)."""
    if not counts:
        return []
    grid, distinct, post, at = posteriors(counts, cfg)
    bands = band_labels(grid, cfg)
    names = sorted(set(bands))
    onehot = (bands[:, None] == np.array(names)[None, :]).astype(float)  # grid x band
    col = {b: j for j, b in enumerate(names)}
    pmf = {}
    for h in horizons:
        m = h * batch
        k = np.arange(m + 1)[:, None]
        pmf[m] = np.array([comb(m, int(x)) for x in k[:, 0]], dtype=float)[:, None] * np.exp(
            loglik(k.astype(float), float(m), grid[None, :]))  # (m+1) x grid
    gain = []
    for i, (s, n) in enumerate(distinct):
        now = (post[i] @ onehot)[col[difficulty_label(s, n, cfg)]]
        best = 0.0
        for m, b in pmf.items():
            mass = (b * post[i][None, :]) @ onehot  # (k passes among m more) x band: joint mass
            expected = sum(mass[k, col[difficulty_label(s + k, n + m, cfg)]] for k in range(m + 1))
            best = max(best, (expected - now) / m)
        gain.append(float(best))
    return [gain[i] for i in at]
