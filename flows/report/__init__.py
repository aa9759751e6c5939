"""The build report: `<build>/report/index.html`, a self-contained page (plots, stage table, yield
funnel, difficulty, episodes, trust, quality, comparison with the previous committed build) with a
trajectory browser. Written at the end of every committed build and by `trajforge report`.

Layout of the folder (nothing outside it is written; it is rewritten whole by each render):
    report/index.html              the page (styles and the browser's script inline, the index of
                                   every rollout inline as JSON)
    report/plotly.min.js           plotly's own bundle, from the installed `plotly` package
    report/episodes/chunk-*.js     full episodes, loaded when one is opened (see `episodes.py`)
    report/compare-<A>.html        `trajforge report B --compare A B`: the same page compared with A
Viewing needs no network: every script is in the folder.
"""

from __future__ import annotations

import posixpath
from typing import Callable

from ...tasks.engine.store import RunStore

REPORT_DIR = "report"


def report_path(store: RunStore, build_id: str, compare_to: str | None = None) -> str:
    """Where the report of `build_id` is (or will be) written."""
    name = "index.html" if compare_to is None else f"compare-{compare_to}.html"
    return posixpath.join(store.build_dir(build_id), REPORT_DIR, name)


def write_report(store: RunStore, build_id: str, compare_to: str | None = None) -> str:
    """Render the report of `build_id` (compared with `compare_to`, default: the previous committed
    build of the dataset); return the page's path. Raises FileNotFoundError for an unknown build."""
    from .render import render

    return render(store, build_id, compare_to)


def write_report_safely(store: RunStore, build_id: str, say: Callable[[str], None]) -> str | None:
    """`write_report` for the end of a build: a failure is printed (one line) and never raised, so a
    committed build is never failed by its report."""
    try:
        return write_report(store, build_id)
    except Exception as err:  # the build is committed; the report can be written again with `trajforge report`
        say(f"could not write the report of build {build_id} ({err.__class__.__name__}: {err}); "
            f"run `trajforge report {build_id}` to try again")
        return None
