"""Assemble the report page: facts + episodes + plots + comparison, through one Jinja template."""

from __future__ import annotations

import datetime as dt
import json
import posixpath
from importlib import resources
from typing import Any

from markupsafe import Markup

from ...tasks.engine.store import RunStore
from . import REPORT_DIR, report_path
from .episodes import EpisodeData, kinds, page_index, script_json
from .gather import BuildFacts, FigureKey, audit_survivors, breakdowns, build_facts, previous_committed
from .plots import all_plots


def _number(v: float | None) -> str:
    if v is None:
        return "–"
    return f"{int(v):,}" if float(v).is_integer() else f"{v:,.3f}"


def figure_html(facts: BuildFacts, key: FigureKey) -> Markup:
    """A number copied from the stats files, tagged with the key it was read at (tests check each)."""
    return Markup('<span class="num" data-figure="{}">{}</span>').format(json.dumps(list(key)),
                                                                       _number(facts.figure(key)))


def comparison(old: BuildFacts | None, new: BuildFacts) -> dict[str, Any] | None:
    """Per figure: old, new, change; per stage instance: same fingerprint or not."""
    if old is None:
        return None
    a, b = old.comparable(), new.comparable()
    rows = []
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key), b.get(key)
        rows.append({"figure": " · ".join(key), "old": _number(va), "new": _number(vb),
                     "delta": "" if va == vb else (_number(vb - va) if va is not None and vb is not None else "new"
                                                    if va is None else "gone"),
                     "changed": va != vb})
    rows.sort(key=lambda r: (not r["changed"], r["figure"]))
    fa = {s.instance: s.fingerprint for s in old.stages}
    stages = [{"instance": s.instance, "old": fa.get(s.instance, "–"), "new": s.fingerprint,
               "same": fa.get(s.instance) == s.fingerprint} for s in new.stages]
    return {"build": old.build_id, "created_at": old.created_at, "rows": rows, "stages": stages,
            "changed": sum(r["changed"] for r in rows)}


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath("static", name).read_text(encoding="utf-8")


def _template():
    import jinja2

    env = jinja2.Environment(loader=jinja2.PackageLoader(__package__, "templates"),
                             autoescape=jinja2.select_autoescape(["html", "j2"]), trim_blocks=True, lstrip_blocks=True)
    env.filters["number"] = _number
    return env.get_template("index.html.j2")


def _write_plotly(store: RunStore, folder: str) -> None:
    import plotly
    from plotly.offline import get_plotlyjs

    path = posixpath.join(folder, "plotly.min.js")
    stamp = f"/* plotly.js shipped by the plotly {plotly.__version__} Python package */\n"
    if store.exists(path):
        with store.fs.open(path, "r") as f:
            if f.readline() == stamp.rstrip("\n") + "\n":
                return
    store.write_text(path, stamp + get_plotlyjs())


def render(store: RunStore, build_id: str, compare_to: str | None = None) -> str:
    facts = build_facts(store, build_id)
    rec = store.read_build(build_id)
    folder = posixpath.join(store.build_dir(build_id), REPORT_DIR)
    store.remove(posixpath.join(folder, "episodes"))  # chunks of an older render
    episodes = EpisodeData(store, rec, facts)
    rows = episodes.write(folder)
    b = breakdowns(facts, rows, episodes.calibration)
    other = compare_to or previous_committed(store, build_id)
    old = build_facts(store, other) if other else None
    if old is not None and old.dataset != facts.dataset:
        raise ValueError(f"cannot compare build {build_id} with {other}: other dataset ({old.dataset})")
    _write_plotly(store, folder)
    flagged_rows = {kind: len(ids) for kind, ids in b.flagged.items()}
    html = _template().render(
        facts=facts, rec=rec, fig=lambda *key: figure_html(facts, key), plots={k: Markup(v) for k, v in all_plots(facts, b).items()}, b=b,
        compare=comparison(old, facts), explicit_compare=compare_to is not None, flagged_rows=flagged_rows,
        severities=_severities(rows), survivors=audit_survivors(store, facts, episodes.envs), episodes=len(rows), kinds=kinds(episodes.envs, rows),
        index_json=Markup(script_json(page_index(rows))), css=Markup(_asset("report.css")),
        js=Markup(_asset("report.js")), generated=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
    path = report_path(store, build_id, compare_to)
    store.write_text(path, html)
    return store.url(path)


def _severities(rows: list[dict]) -> dict[str, str]:
    out: dict[str, str] = {}
    for r in rows:
        for k, sev in r["kinds"].items():
            out[k] = "hack" if "hack" in (sev, out.get(k)) else sev
    return out
