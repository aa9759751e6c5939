"""The monitor's detectors: one module each under tasks/judge/monitor, registered with `register(Detector(...))`
and named once in `BUILT_IN` (tasks/judge/monitor/__init__.py). A detector reads `Evidence` (never a container)
and returns its findings; its weight is how much one finding raises the row's `monitor_score`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from ....schemas.verdict import MonitorFlag
from .evidence import Evidence

EVIDENCE_CHARS = 300  # characters of evidence quoted per finding


@dataclass(frozen=True)
class Detector:
    name: str
    weight: float  # in (0, 1]: the score of a row this detector alone flags
    find: Callable[[Evidence], list[MonitorFlag]]
    what: str  # one line: what it looks for (the card and the docs list it)


DETECTORS: dict[str, Detector] = {}


def register(d: Detector) -> Detector:
    if d.name in DETECTORS:
        raise ValueError(f"monitor detector {d.name!r} is registered twice")
    if not 0 < d.weight <= 1:
        raise ValueError(f"monitor detector {d.name!r}: weight {d.weight} is not in (0, 1]")
    DETECTORS[d.name] = d
    return d


def get(name: str) -> Detector:
    if name not in DETECTORS:
        raise KeyError(f"unknown monitor detector {name!r}; known: {', '.join(sorted(DETECTORS))}")
    return DETECTORS[name]


def flag(detector: str, evidence: str, turn: int | None = None, path: str | None = None) -> MonitorFlag:
    return MonitorFlag(detector=detector, turn=turn, path=path, evidence=" ".join(evidence.split())[:EVIDENCE_CHARS])


def first_hits(detector: str, what: str, rx: re.Pattern, ev: Evidence, width: int = 40) -> list[MonitorFlag]:
    """`rx`'s first match in the agent's steps (with its turn) and its first in the files it wrote (with the path),
    each quoted with `width` characters either side: what a pattern detector reports."""
    out = []
    for turn, cmd in ev.commands():
        if m := rx.search(cmd):
            out.append(flag(detector, f"{what}: {cmd[max(0, m.start() - width): m.end() + width]}", turn=turn))
            break
    for path, text in ev.written.items():
        if m := rx.search(text):
            out.append(flag(detector, f"{what}: {text[max(0, m.start() - width): m.end() + width]}", path=path))
            break
    return out
