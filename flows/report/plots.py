"""The report's plots, with plotly: each function returns an HTML fragment (a `div.tf-plot` and the
`Plotly.newPlot` call), or "" when there is nothing to plot.

Why plotly: its Python package ships `plotly.min.js` itself (`plotly.offline.get_plotlyjs()`), so a
report renders with no network and no extra asset download; figures are interactive (hover, zoom,
legend toggles) in one self-contained script. Altair would need the vega, vega-lite and vega-embed
scripts, which its wheel does not ship.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, get_args

from ...schemas.calibration import Label
from ...tasks.teachers.cpu_profile import aggregate_throughput
from .gather import Breakdowns, BuildFacts

LABELS = list(get_args(Label))
STATUSES = ["ok", "max_turns", "agent_timeout", "context_overflow", "format_error", "agent_killed_sandbox",
            "infra_error", "teacher_error", "harness_unavailable"]
CONFIG = {"displaylogo": False, "responsive": True}

TITLE_TOP = 34  # px from the figure's top to its title: below the mode bar (the toolbar, top right)


def _html(fig, name: str, height: int = 320) -> str:
    """The figure as a div + script. Its title sits below the mode bar, never under it; the page's grid
    gives each figure its final width before it is drawn (report.css `.cols`)."""
    fig.update_layout(height=height, margin={"l": 50, "r": 20, "t": TITLE_TOP + 40, "b": 50}, template="plotly_white",
                      legend={"orientation": "h", "y": -0.25},
                      title={"x": 0, "xref": "paper", "xanchor": "left", "y": 1, "yref": "container",
                             "yanchor": "top", "pad": {"t": TITLE_TOP}})
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"plot-{name}", config=CONFIG)


def funnel(facts: BuildFacts) -> str:
    import plotly.graph_objects as go

    steps = [("candidates (environments)", ("propose", "candidates")),
             ("kept by validator (environments)", ("synthesize", "yield")),
             ("rollouts (episodes)", ("rollout", "episodes")), ("verified (episodes)", ("verify", "verified")),
             ("passed (episodes)", ("verify", "passed"))]
    names, values = [], []
    for label, key in steps:
        if key == ("propose", "candidates"):
            v = sum(facts.figure((*key, s)) or 0 for s in facts.keys(*key))
        elif key == ("synthesize", "yield"):
            v = sum(facts.figure((*key, k)) or 0 for k in facts.keys(*key) if k.endswith("|kept"))
        else:
            v = facts.figure(key) or 0
        names.append(label)
        values.append(v)
    for c in facts.keys("export", "configs"):
        names.append(f"exported: {c} (rows)")
        values.append(facts.figure(("export", "configs", c)) or 0)
    fig = go.Figure(go.Funnel(y=names, x=values, textinfo="value"))
    fig.update_layout(title="yield funnel")
    return _html(fig, "funnel", 360)


def stage_time(facts: BuildFacts) -> str:
    import plotly.graph_objects as go

    rows = [s for s in facts.stages if s.wall_s is not None]
    if not rows:
        return ""
    fig = go.Figure(go.Bar(x=[s.instance for s in rows], y=[s.wall_s for s in rows], name="wall (s)"))
    fig.add_bar(x=[s.instance for s in rows], y=[s.shard_seconds or 0 for s in rows], name="shard task time (s)")
    fig.update_layout(title="where the build's time went (stages run in this build)", barmode="group",
                      yaxis_title="seconds")
    return _html(fig, "stage-time")


def labels(b: Breakdowns) -> str:
    import plotly.graph_objects as go

    if not b.calibration:
        return ""
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for c in b.calibration:
        counts[c["teacher"]][c["label"]] += 1
    present = [lab for lab in LABELS if any(lab in c for c in counts.values())]
    fig = go.Figure([go.Bar(name=t, x=present, y=[c.get(lab, 0) for lab in present]) for t, c in sorted(counts.items())])
    fig.update_layout(title="difficulty labels per teacher (environments)", barmode="group")
    return _html(fig, "labels")


def solve_rates(b: Breakdowns) -> str:
    import plotly.graph_objects as go

    by_teacher: dict[str, list[float]] = defaultdict(list)
    for c in b.calibration:
        if c["label"] != "unlabelled":
            by_teacher[c["teacher"]].append(c["solve_rate"])
    if not by_teacher:
        return ""
    fig = go.Figure([go.Histogram(name=t, x=v, xbins={"start": 0, "end": 1.0001, "size": 0.1}, opacity=0.75)
                     for t, v in sorted(by_teacher.items())])
    fig.update_layout(title="solve-rate distribution per teacher", barmode="overlay", xaxis_title="solve rate",
                      yaxis_title="environments")
    return _html(fig, "solve-rates")


def family_levels(b: Breakdowns) -> str:
    """Mean solve rate per (family × level) and teacher, as a heatmap."""
    import plotly.graph_objects as go

    acc: dict[tuple[str, str], list[float]] = defaultdict(list)
    for c in b.calibration:
        if c["label"] != "unlabelled":
            acc[(f"{c['family']} L{c['level']}", c["teacher"])].append(c["solve_rate"])
    if not acc:
        return ""
    xs = sorted({k[0] for k in acc})
    ys = sorted({k[1] for k in acc})
    z = [[round(sum(acc[(x, y)]) / len(acc[(x, y)]), 3) if acc.get((x, y)) else None for x in xs] for y in ys]
    text = [[f"{len(acc.get((x, y), []))} env" for x in xs] for y in ys]
    fig = go.Figure(go.Heatmap(x=xs, y=ys, z=z, zmin=0, zmax=1, colorscale="Viridis", text=text,
                               hovertemplate="%{x}<br>%{y}<br>mean solve rate %{z}<br>%{text}<extra></extra>"))
    fig.update_layout(title="mean solve rate per family × level and teacher")
    return _html(fig, "family-levels", 140 + 40 * len(ys))


def status_by_teacher(b: Breakdowns) -> str:
    import plotly.graph_objects as go

    if not b.status_by_teacher:
        return ""
    teachers = list(b.status_by_teacher)
    present = [s for s in STATUSES if any(s in c for c in b.status_by_teacher.values())]
    present += sorted({s for c in b.status_by_teacher.values() for s in c} - set(present))
    fig = go.Figure([go.Bar(name=s, x=teachers, y=[b.status_by_teacher[t].get(s, 0) for t in teachers])
                     for s in present])
    fig.update_layout(title="episode status per teacher", barmode="stack", yaxis_title="episodes")
    return _html(fig, "status")


def distribution(values: dict[str, list[int]], name: str, title: str, axis: str) -> str:
    import plotly.graph_objects as go

    if not values:
        return ""
    fig = go.Figure([go.Histogram(name=t, x=v, opacity=0.75) for t, v in sorted(values.items())])
    fig.update_layout(title=title, barmode="overlay", xaxis_title=axis, yaxis_title="episodes")
    return _html(fig, name)


AGGREGATE, PER_CALL = "aggregate: tokens ÷ rollout wall time", "per call: tokens ÷ summed teacher call time"


def throughput(facts: BuildFacts, b: Breakdowns) -> str:
    """Two measures side by side, each labelled: the aggregate (completion tokens over the rollout
    stage's wall time, its shards' `driver_wall_seconds`: what the build prints; `all teachers` and
    each teacher's share) and tokens over the summed time of each teacher's own calls (one request's
    speed: concurrent calls overlap, so it is far below the aggregate on a batching server)."""
    import plotly.graph_objects as go

    tokens, wall = facts.figure(("rollout", "completion_tokens")), facts.figure(("rollout", "driver_wall_seconds"))
    total = aggregate_throughput(tokens, wall)
    calls = {t: v for t, v in b.throughput.items() if v["teacher_seconds"] > 0}
    if total is None and not calls:
        return ""
    fig = go.Figure()
    if total is not None:
        teachers = [t for t, v in b.throughput.items() if v["completion_tokens"]]
        fig.add_bar(name=AGGREGATE, x=["all teachers", *teachers],
                    y=[round(total, 2), *[round(b.throughput[t]["completion_tokens"] / wall, 2) for t in teachers]],
                    text=[f"{tokens:.0f} tok / {wall:.0f} s", *[f"{b.throughput[t]['completion_tokens']:.0f} tok / "
                                                               f"{wall:.0f} s" for t in teachers]])
    if calls:
        fig.add_bar(name=PER_CALL, x=list(calls), y=[v["tokens_per_s"] for v in calls.values()],
                    text=[f"{v['completion_tokens']:.0f} tok / {v['teacher_seconds']:.0f} s" for v in calls.values()])
    fig.update_layout(title="teacher throughput (completion tokens/s)", yaxis_title="tokens/s", barmode="group")
    return _html(fig, "throughput")


def counts(facts: BuildFacts, stage: str, key: str, name: str, title: str) -> str:
    import plotly.graph_objects as go

    kinds = facts.keys(stage, key)
    if not kinds:
        return ""
    fig = go.Figure(go.Bar(x=kinds, y=[facts.figure((stage, key, k)) or 0 for k in kinds]))
    fig.update_layout(title=title)
    return _html(fig, name, 280)


def step_shares(b: Breakdowns) -> str:
    import plotly.graph_objects as go

    teachers = [t for t, c in b.step_labels.items() if sum(c.values())]
    if not teachers:
        return ""
    fig = go.Figure()
    for lab in ("inspect", "act", "verify"):
        fig.add_bar(name=lab, x=teachers, y=[b.step_labels[t].get(lab, 0) / sum(b.step_labels[t].values())
                                             for t in teachers])
    fig.update_layout(title="inspect / act / verify share of commands per teacher", barmode="stack",
                      yaxis={"tickformat": ".0%"})
    return _html(fig, "step-shares")


def all_plots(facts: BuildFacts, b: Breakdowns) -> dict[str, Any]:
    return {
        "funnel": funnel(facts), "stage_time": stage_time(facts), "labels": labels(b),
        "solve_rates": solve_rates(b), "family_levels": family_levels(b), "status": status_by_teacher(b),
        "turns": distribution(b.turns, "turns", "turns per episode", "turns"),
        "tokens": distribution(b.completion_tokens, "tokens", "completion tokens per episode", "completion tokens"),
        "throughput": throughput(facts, b),
        "hacks": counts(facts, "verify", "hacks", "hacks", "hack flags by kind (verified rollouts)"),
        "modes": counts(facts, "verify", "modes", "modes", "where the hidden tests ran (verification mode)"),
        "monitor": counts(facts, "verify", "monitor", "monitor", "the monitor's findings by detector (rows)"),
        "step_shares": step_shares(b),
    }
