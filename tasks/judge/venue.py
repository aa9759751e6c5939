"""Where the hidden tests run: the one place a "venue" is chosen (`verify.venue`) and what each one means.

| venue | when the tests run | in which container | `Verdict.mode` |
|---|---|---|---|
| `fresh` (default) | right after the episode (rollout stage) | a NEW container created from a commit of the stopped episode container (its files as the engine holds them, owners and modes included), entrypoint, command and healthcheck set by trajforge; the episode's volumes carried as files | `fresh` |
| `in_place` (opt-in, faster) | right after the episode (rollout stage) | the episode's own container, restarted for a root agent; an image with a VOLUME, or (root agent) an ENTRYPOINT, is judged `fresh` instead (a restart would run the entrypoint on the agent's files; the walk never sees a volume) | `in_place` (or `fresh`) |
| `isolated` | in the verify stage | a container of the environment's image (trajforge's entrypoint) plus the final state captured, like `fresh`'s, from a new container of the episode's commit (`final_state`, `outside_state`, `changes`): what re-verifies stored rollouts | `isolated` |

Invariants: every consumer asks `of(config)` (or `VENUES[name]`), never a boolean of its own; the rollout
stage's fingerprint includes the venue (tests it runs are part of its rows); a recorded test run carries the
venue it ran in (`InPlaceTests.venue`), and the verdict's mode is that venue. Retired keys
(`rollout.verify_in_place`, `verify.isolated`) are mapped by `schemas.config.retired_venue_keys`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Venue:
    name: str
    during_rollout: bool  # the rollout stage runs the tests once the episode ended (recorded in the row)
    fresh_container: bool  # the episode's container is committed and judged (walk, capture, tests) in a new one
    doc: str


VENUES: dict[str, Venue] = {
    "fresh": Venue("fresh", True, True, "a new container from the episode's committed files"),
    "in_place": Venue("in_place", True, False, "the episode's own container (restarted for a root agent)"),
    "isolated": Venue("isolated", False, True, "the image plus the captured final state, in the verify stage"),
}
DEFAULT = "fresh"


def of(config: Any) -> Venue:
    """The venue of a build config (`verify.venue`)."""
    return VENUES[config.verify.venue]


def named(name: str | None) -> Venue:
    """The venue called `name` (None: no tests during the rollout, i.e. `isolated`); a clear error otherwise."""
    if name is None:
        return VENUES["isolated"]
    try:
        return VENUES[name]
    except KeyError:
        raise ValueError(f"unknown verification venue {name!r}: one of {', '.join(VENUES)}") from None
