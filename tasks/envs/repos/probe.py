"""One container run of a repository task's candidate (issue 43): the project's whole suite on the task's starting
state, then the reference solution, then the suite twice more on the solved state (a test whose outcome differs
between those two is flaky). What comes out is what `testlists.lists` needs. Planted bugs of one revision share
their solved state (the revision itself): `make.py` runs its suite twice once (`repeats=1` with no solution) and
each bug's probe runs the suite once, applies the inverse patch and checks it gave the revision's files back.

Timeouts (a busy machine is never read as a property of the task): the runs of the solved state (the revision's own
suite) have the config's `test_timeout_s`; one that runs past it is infrastructure (`SuiteTooSlow`, a `SandboxError`:
the item is retried when the stage runs again), never a reject. A run of the starting state is a hang (`tests_hang`)
only when it ran past `hang_budget(T)`, T the solved state's own suite time measured beside it: planted bugs know T
before their run and stop it there (a bug that loops costs that budget, not the ceiling); a commit's starting state
runs first with the ceiling, and when it times out, `make.py` asks whether the ceiling was past the budget.

Invariants: the container is the task's own image (the agent's, without tests), the hidden test files are put in
by the engine (as the verifier does), the reference solution runs as the agent would run it, and the suite runs as
root with `grade.py outcomes` (the project's own test command, JUnit XML read back to node ids). Nothing is
written into the image; the container is removed whatever happens. Docker failing is `SandboxError` (the caller's
`validation_infra`), never a verdict on the candidate.
"""

from __future__ import annotations

import glob
import json
import time
from dataclasses import dataclass, field

from ....schemas.common import FileSpec
from ....schemas.config import SandboxConfig
from ...sandbox import Sandbox, SandboxError
from .grade import MARK

TESTS = "/tests"
HANG_FACTOR = 10  # a starting state's suite running this many times the solved state's own is a hang
HANG_FLOOR_S = 30.0  # ... and never less than this (a suite of a second: start-up costs dominate)


class SuiteTooSlow(SandboxError):
    """The solved state's own suite ran past `test_timeout_s`: a busy machine or a too-small ceiling, never
    something a task can be rejected for (infrastructure: the item runs again with the stage)."""


def hang_budget(clean_s: float, ceiling_s: float) -> float:
    """How long a starting state's suite may run before it is a hang: `HANG_FACTOR` times the solved state's own
    suite time, at least `HANG_FLOOR_S`, at most `ceiling_s` (the config's `test_timeout_s`)."""
    return min(ceiling_s, max(HANG_FLOOR_S, HANG_FACTOR * clean_s))


@dataclass
class Run:
    """One run of the suite: node id -> outcome, failure messages, exit code, the output's tail."""

    outcomes: dict[str, str] = field(default_factory=dict)
    messages: dict[str, str] = field(default_factory=dict)
    exit: int | None = None
    tail: str = ""
    error: str | None = None  # the run printed no result (timed out, crashed before the grader answered)
    seconds: float = 0.0  # wall time of the run
    budget_s: float = 0.0  # the timeout it ran under


@dataclass
class Probe:
    before: Run
    solution_error: str | None  # the reference solution failed to apply or run (its output tail)
    after: list[Run]


def check_hang(before: Run, after: list[Run], ceiling_s: float) -> None:
    """A starting state's run that timed out under the ceiling `ceiling_s` (a commit's: its solved state's suite
    time T was not known yet) counts as a hang only when the ceiling was at least `hang_budget(T)`, T the slowest
    run of `after`; otherwise the machine was too slow to tell a hang from a busy machine: `SuiteTooSlow`."""
    if before.error != "timed out" or not after:
        return
    clean = max(r.seconds for r in after)
    if ceiling_s < hang_budget(clean, float("inf")):
        raise SuiteTooSlow(f"the starting state's suite ran past test_timeout_s={ceiling_s:g}s and the solved "
                           f"state's own took {clean:.0f}s: too close to tell a hang from a busy machine (raise "
                           "`test_timeout_s`, or run on a quieter machine)")


def _parse(output: str, timed_out: bool) -> Run:
    _, sep, tail = output.rpartition(MARK)
    if timed_out or not sep:
        return Run(error="timed out" if timed_out else "the grader printed no result", tail=output[-3000:])
    try:
        data = json.loads(tail.strip().splitlines()[0])
    except (ValueError, IndexError) as e:
        return Run(error=f"unparseable result: {e}", tail=output[-3000:])
    run = Run(data["outcomes"], data["messages"], data["exit"], data["tail"])
    if data["exit"] == -9:  # the grader's own timeout killed the suite
        run.error = "timed out"
    return run


def probe(client, image: str, cfg: SandboxConfig, workdir: str, tests: list[FileSpec], solution: list[str],
          timeout_s: float, labels: dict[str, str] | None = None, repeats: int = 2,
          restores: dict[str, str] | None = None, before_timeout_s: float | None = None) -> Probe:
    """The suite before the reference solution (within `before_timeout_s`, default `timeout_s`), then `repeats`
    times after it, in one container of `image`. `restores` (work-dir path -> `checksums.file_digest`): the files
    the solution must leave with exactly these contents (a planted bug's inverse patch gives back the revision's
    files, whose suite runs are shared: `repeats=0`); a file that differs is a `solution_error`. A run of the solved
    state that times out raises `SuiteTooSlow`: every run after the solution, and the first one too when there is
    no solution (`solution=[]`: the image is the solved state, a revision's own suite runs)."""
    with Sandbox(client, image, cfg, workdir=workdir, labels={"trajforge.role": "repo-probe", **(labels or {})}) as sb:
        sb.put_files([FileSpec(path=t.path, content=t.content, mode=t.mode | 0o500) for t in tests], parent="/",
                     root=TESTS.strip("/"), uid=0, dir_mode=0o700)
        def suite(budget: float) -> Run:
            t0 = time.monotonic()
            res = sb.exec(f"/usr/bin/python3 -I {TESTS}/grade.py outcomes {budget:g}", timeout_s=budget + 30,
                          user="root", output_limit=8 << 20)
            out = _parse(res.output, res.timed_out)
            out.seconds, out.budget_s = time.monotonic() - t0, budget
            return out

        def solved() -> Run:
            out = suite(timeout_s)
            if out.error == "timed out":
                raise SuiteTooSlow(f"the solved state's own suite ran past test_timeout_s={timeout_s:g}s (a busy "
                                   "machine, or a ceiling too small for this project: raise `test_timeout_s`); "
                                   f"its output's tail: {out.tail[-300:]}")
            return out

        before = suite(before_timeout_s or timeout_s) if solution else solved()
        for cmd in solution:
            res = sb.exec(cmd, timeout_s=120)
            if res.timed_out or res.exit_code != 0:
                return Probe(before, f"exit {res.exit_code}: {res.output[-1500:]}", [])
        if restores:
            paths = sorted(restores)
            got = sb.digests([glob.escape(p) for p in paths])  # the protected paths' checksum, read as root
            wrong = [p for p in paths if got.get(p) != restores[p]]
            if wrong:
                return Probe(before, f"the solution does not give back the revision's {', '.join(wrong)}", [])
        return Probe(before, None, [solved() for _ in range(repeats)])
