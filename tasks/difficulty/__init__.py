"""What calibration computes beyond counting: posteriors over solve rates under an empirical-Bayes prior
(`posterior`: label confidence, the expected gain of more rollouts) and the joint fit of teacher ability
and environment difficulty across teachers (`pooled`)."""

from .pooled import PooledFit, fit_pooled
from .posterior import band_labels, label_confidence, label_gain, rate_grid

__all__ = ["PooledFit", "band_labels", "fit_pooled", "label_confidence", "label_gain", "rate_grid"]
