"""Figures the suites check that no single row or stats value holds: per-row aggregates over a group
(a teacher's format-error share, a family's share of the kept set, how many rows share one
trajectory) and ratios of `stats.json` counters (yield per source, a reject reason's share).

Row figures become scalar columns of the frame handed to Great Expectations, so a failed
expectation names the offending rows (their ids) like any other. Each declares the scalar output
columns it reads (`gate_columns` asks for them). A row figure may be NaN where it does not apply
(GX map expectations skip missing values).

`GateFacts` is all of the build config a suite's defaults may depend on (`{"$fact": NAME}` in a
suite): the facts are resolved into the effective suite, which is what a stage's gate hash covers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable

import pandas as pd


@dataclass(frozen=True)
class GateFacts:
    """What a default threshold may depend on. Defaults: no config known (a suite run on its own)."""

    max_turns: int | None = None  # rollout.max_turns: no episode may have more model turns
    family_share: float = 1.0  # the largest share one family may take of the kept environments
    episodes_per_env: int | None = None  # the most episodes one environment gets (all teachers, all rounds)

    @classmethod
    def of(cls, config: Any) -> "GateFacts":
        s, r = config.synthesize, config.rollout
        # several procedural families and nothing else: the config asks for a spread (imports and LLM
        # themes have no declared family set, one family is a deliberate choice)
        spread = len({f.name for f in s.families}) >= 2 and not s.imports and not s.llm
        adaptive = config.calibrate.adaptive
        per_teacher = [max(t.samples_per_env or r.samples_per_env, adaptive.max_samples if adaptive else 0)
                       for t in config.teachers]
        return cls(max_turns=r.max_turns, family_share=0.8 if spread else 1.0, episodes_per_env=sum(per_teacher))

    def get(self, name: str) -> Any:
        values = asdict(self)
        if name not in values:
            raise KeyError(f"unknown gate fact {name!r} (known: {', '.join(sorted(values))})")
        return values[name]


@dataclass(frozen=True)
class RowFigure:
    inputs: tuple[str, ...]
    compute: Callable[[pd.DataFrame], pd.Series]
    doc: str


def _group_share(df: pd.DataFrame, by: str, column: str, value: Any) -> pd.Series:
    return (df[column] == value).groupby(df[by]).transform("mean").astype(float)


def _value_share(df: pd.DataFrame, column: str) -> pd.Series:
    return df.groupby(column)[column].transform("size").astype(float) / max(len(df), 1)


def _copies(df: pd.DataFrame, by: str, column: str) -> pd.Series:
    """Rows sharing this row's `by` and `column` values; NaN where `column` is empty (not computed: an
    older output)."""
    copies = df.groupby([by, column])[column].transform("size").astype(float)
    return copies.where(df[column].fillna("") != "")


def _solve_rate_error(df: pd.DataFrame) -> pd.Series:
    attempts = df["attempts"].astype(float)
    return ((df["solve_rate"] - df["passes"] / attempts.where(attempts > 0)).abs()).astype(float)


INFRA = ("infra_error", "teacher_error", "harness_unavailable")  # schemas.common.INFRA_STATUSES (kept apart: no import cycle)


def _model_final_turns(df: pd.DataFrame) -> pd.Series:
    return df["turns"].astype(float).where(~df["status"].isin(INFRA))


def _flagged_pass(df: pd.DataFrame) -> pd.Series:
    return (~df["passed"].astype(bool)).astype(float).where(df["tests_passed"].astype(bool))


def _attempted_label(df: pd.DataFrame) -> pd.Series:
    return df["label"].where(df["attempts"] > 0)


ROW_FIGURES: dict[str, RowFigure] = {
    "model_final_turns": RowFigure(("turns", "status"), _model_final_turns,
                                   "model turns of a model-final episode (NaN for infrastructure outcomes)"),
    "flagged_pass": RowFigure(("passed", "tests_passed"), _flagged_pass,
                              "1 for a submitted episode passing every test but hack-flagged, 0 if not flagged, "
                              "NaN when the tests did not all pass"),
    "attempted_label": RowFigure(("label", "attempts"), _attempted_label,
                                 "the label of a pair with a counted attempt (None without)"),
    "family_share": RowFigure(("family",), lambda df: _value_share(df, "family"),
                              "the share of the rows that have this row's family"),
    "teacher_format_error_share": RowFigure(
        ("teacher", "status"), lambda df: _group_share(df, "teacher", "status", "format_error"),
        "the share of this row's teacher's episodes that ended as format_error"),
    # per environment: environments with the same prompt (a family whose instruction does not vary by
    # seed) legitimately share a deterministic teacher's trajectories
    "trajectory_copies": RowFigure(("env_id", "content_hash"), lambda df: _copies(df, "env_id", "content_hash"),
                                   "how many rows of this row's environment hold exactly its messages"),
    "solve_rate_error": RowFigure(("solve_rate", "passes", "attempts"), _solve_rate_error,
                                  "|solve_rate - passes / attempts| (NaN without attempts)"),
}


def add_row_figures(df: pd.DataFrame, names: set[str]) -> pd.DataFrame:
    """`df` with the named figures as extra columns (those whose inputs are all present)."""
    for name in sorted(names):
        fig = ROW_FIGURES[name]
        if all(c in df.columns for c in fig.inputs):
            df[name] = fig.compute(df) if len(df) else pd.Series(dtype=float)
    return df


# -- figures of stats.json (+ the stage's rejects) -----------------------------------------------------
# Each returns {label: value}: one value for the stage ("" label) or one per group (e.g. per source),
# and the offending keys of a label (reject keys) when the figure knows them.

def _stat(stats: dict[str, Any], key: str) -> dict[str, float | None]:
    value: Any = stats
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return {"": value if isinstance(value, (int, float)) and not isinstance(value, bool) else None}


def _reject_share(stats: dict[str, Any], reason: str) -> dict[str, float | None]:
    units = stats.get("rows", 0) + stats.get("rejects", 0)
    return {"": stats.get("reject_reasons", {}).get(reason, 0) / units if units else 0.0}


def _yield_by_source(stats: dict[str, Any]) -> dict[str, float | None]:
    """kept / candidates per source kind, from the `source|outcome` counters of `stats["yield"]`."""
    totals: dict[str, list[int]] = {}
    for key, n in (stats.get("yield") or {}).items():
        source, _, outcome = key.partition("|")
        t = totals.setdefault(source, [0, 0])
        t[0] += n
        t[1] += n if outcome == "kept" else 0
    return {source: kept / total if total else None for source, (total, kept) in sorted(totals.items())}


STATS_FIGURES: dict[str, Callable[..., dict[str, float | None]]] = {
    "stat": _stat,
    "reject_share": _reject_share,
    "yield_by_source": _yield_by_source,
}
