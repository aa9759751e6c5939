"""One container run of a repository task's candidate (issue 43): the project's whole suite on the task's starting
state, then the reference solution, then the suite twice more on the solved state (a test whose outcome differs
between those two is flaky). What comes out is what `testlists.lists` needs. Planted bugs of one revision share
their solved state (the revision itself): `make.py` runs its suite twice once (`repeats=1` with no solution) and
each bug's probe runs the suite once, applies the inverse patch and checks it gave the revision's files back.

Invariants: the container is the task's own image (the agent's, without tests), the hidden test files are put in
by the engine (as the verifier does), the reference solution runs as the agent would run it, and the suite runs as
root with `grade.py outcomes` (the project's own test command, JUnit XML read back to node ids). Nothing is
written into the image; the container is removed whatever happens. Docker failing is `SandboxError` (the caller's
`validation_infra`), never a verdict on the candidate.
"""

from __future__ import annotations

import glob
import json
from dataclasses import dataclass, field

from ....schemas.common import FileSpec
from ....schemas.config import SandboxConfig
from ...sandbox import Sandbox
from .grade import MARK

TESTS = "/tests"


@dataclass
class Run:
    """One run of the suite: node id -> outcome, failure messages, exit code, the output's tail."""

    outcomes: dict[str, str] = field(default_factory=dict)
    messages: dict[str, str] = field(default_factory=dict)
    exit: int | None = None
    tail: str = ""
    error: str | None = None  # the run printed no result (timed out, crashed before the grader answered)


@dataclass
class Probe:
    before: Run
    solution_error: str | None  # the reference solution failed to apply or run (its output tail)
    after: list[Run]


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
          restores: dict[str, str] | None = None) -> Probe:
    """The suite before the reference solution, then `repeats` times after it, in one container of `image`.
    `restores` (work-dir path -> `checksums.file_digest`): the files the solution must leave with exactly these
    contents (a planted bug's inverse patch gives back the revision's files, whose suite runs are shared:
    `repeats=0`); a file that differs is a `solution_error`."""
    with Sandbox(client, image, cfg, workdir=workdir, labels={"trajforge.role": "repo-probe", **(labels or {})}) as sb:
        sb.put_files([FileSpec(path=t.path, content=t.content, mode=t.mode | 0o500) for t in tests], parent="/",
                     root=TESTS.strip("/"), uid=0, dir_mode=0o700)
        run = f"/usr/bin/python3 -I {TESTS}/grade.py outcomes"

        def suite() -> Run:
            res = sb.exec(run, timeout_s=timeout_s + 30, user="root", output_limit=8 << 20)
            return _parse(res.output, res.timed_out)

        before = suite()
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
        return Probe(before, None, [suite() for _ in range(repeats)])
