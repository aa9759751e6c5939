"""The difficulty bands of a solve rate (definitions: `schemas.calibration.LABEL_DEFINITIONS`)."""

from __future__ import annotations

from ...schemas.calibration import CERTAINTY_DEFINITION, LABEL_DEFINITIONS, POOLED_DEFINITION, Label
from ...schemas.config import CalibrateConfig


def label_of_rate(p: float, cfg: CalibrateConfig) -> Label:
    """The band of a solve rate: p < unsolved_below (or p == 0) is `unsolved`; each boundary belongs to
    the band above it."""
    if p == 0 or p < cfg.unsolved_below:
        return "unsolved"
    return "trivial" if p >= cfg.trivial else "easy" if p >= cfg.easy else "medium" if p >= cfg.medium else "hard"


def difficulty_label(passes: int, n: int, cfg: CalibrateConfig, solvable: bool = True) -> Label:
    """The band of passes/n. No counted attempt is `unlabelled` (nothing is known), never `unsolved`;
    0 passes of an environment not known to be solvable (`solvable=False`: no reference solution and no
    teacher's pass) is `unverified`, never `unsolved`."""
    if n == 0:
        return "unlabelled"
    if passes == 0 and not solvable:
        return "unverified"
    return label_of_rate(passes / n, cfg)


def label_definitions(cfg: CalibrateConfig) -> dict[str, str]:
    """Each label's definition with this config's thresholds, plus `certain` and `pooled` (what the
    dataset card prints)."""
    values = {"unsolved_below": f"{cfg.unsolved_below:g}", "medium": f"{cfg.medium:g}", "easy": f"{cfg.easy:g}",
              "trivial": f"{cfg.trivial:g}", "fail_rate": f"{1 - cfg.trivial:.3g}", "confidence": f"{cfg.confidence:g}"}
    out = {label: text.format(**values) for label, text in LABEL_DEFINITIONS.items()}
    out["certain"] = CERTAINTY_DEFINITION.format(**values)
    out["pooled"] = POOLED_DEFINITION.format(**values)
    return out
