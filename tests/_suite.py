"""`make test`: the whole suite as two pytest runs, one after the other, with one exit code and one summary.

1. The fast tier (the tests `make test-fast` runs: no Docker engine, no Prefect server, no teacher) on
   `-n WORKERS --dist worksteal`, as `make test-fast` runs it every day. Serially it takes ~3 min on 2 cores
   (a third of it waiting on real timeouts), on 3 workers ~1.
2. Every other test (marker `docker`, `slow`, `vllm` or `teacher`) on `SLOW_WORKERS` workers (2) with
   `--dist loadscope`, scheduled by group (tests/conftest.py `suite_group`): a whole module on one worker (its
   module fixtures set up once), the modules that start the embedded vLLM teacher in one group, one after the other. These tests
   mostly wait (on containers, builds, servers): serially they left the two cores ~3/4 idle and took 76 min.
   What they share across workers is scoped by what they made (build ids, container names, labels, pids);
   each worker has its own session fixtures (a Prefect server, a second engine, a registry). `SLOW_WORKERS=1`
   runs the tier serially in one process, as before.

The two selections are complements (`-m M` and `-m "not (M)"`): every collected test runs exactly once.
The extra arguments (`make test PYTEST_ARGS=...`) go to both runs. An argument that selects by marker, sets
the workers or names a JUnit report itself (`-m`, `-n`, `--dist`, `--junitxml`) makes it one plain serial
`pytest ARGS` run instead, as `make test` was. A run that collects nothing (arguments naming tests of one tier only: pytest exit code 5)
counts as nothing to do while the other tier ran tests.

Order: with pytest-randomly installed (the dev extra) each run shuffles its modules, and the tests within each
module, from one seed; both runs get the same seed, printed first and last (`--randomly-seed=N` in the arguments
replays it, `-p no:randomly` keeps file order).

At the end: each run's outcome, the combined counts and every test that failed, errored or was skipped,
with its reason (from each run's JUnit XML). Exit code: 0 when both runs passed (or one had nothing to
collect), else the first failing run's code.

Usage: python tests/_suite.py [--workers N] [PYTEST ARGS ...]
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

FAST = "not docker and not slow and not vllm and not teacher"  # as the Makefile's test-fast target
NO_TESTS = 5  # pytest.ExitCode.NO_TESTS_COLLECTED
ROOT = Path(__file__).resolve().parent.parent


def own_selection(args: list[str]) -> bool:
    """Whether the arguments select by marker, set xdist's workers or name a JUnit report themselves."""
    return any(a.startswith(("-m", "-n", "--numprocesses", "--dist", "--junitxml", "--junit-xml")) for a in args)


def combine(codes: list[int]) -> int:
    """One exit code for the runs: a run with nothing to collect is fine while another ran tests."""
    ran = [c for c in codes if c != NO_TESTS]
    if not ran:
        return NO_TESTS
    return next((c for c in ran if c != 0), 0)


def outcomes(xml: Path) -> tuple[dict[str, int], list[str]]:
    """Counts (passed, failed, error, skipped) and one `OUTCOME id - reason` line per test that did not pass,
    from a JUnit XML report."""
    counts = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
    lines: list[str] = []
    if not xml.exists():
        return counts, lines
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = "::".join(p for p in (case.get("classname", "").replace(".", "/") + ".py", case.get("name", "")) if p)
        kinds = [c for c in case if c.tag in ("failure", "error", "skipped")]
        if not kinds:
            counts["passed"] += 1
            continue
        for c in kinds:
            kind = {"failure": "failed"}.get(c.tag, c.tag)
            counts[kind] += 1
            reason = (c.get("message") or "").strip().splitlines()
            lines.append(f"{kind.upper()} {name} - {reason[0][:200] if reason else ''}")
    return counts, lines


def order_seed(args: list[str]) -> int | None:
    """A seed for both runs' order when pytest-randomly is installed and the arguments neither give one nor turn
    it off (the two runs then shuffle alike, and one number replays both)."""
    import importlib.util
    import random

    if importlib.util.find_spec("pytest_randomly") is None or "no:randomly" in args or any(
            a.startswith("--randomly-seed") for a in args):
        return None
    return random.randrange(2**32)


INTERRUPTED: list[bool] = []


def run(label: str, cmd: list[str]) -> tuple[int, float]:
    """The run's exit code and wall seconds. Ctrl-C reaches pytest too (one process group): it is waited for,
    so it can stop its servers and containers, and the next run is not started."""
    if INTERRUPTED:
        print(f"\n=== make test, {label}: not started (interrupted)", flush=True)
        return 2, 0.0
    print(f"\n=== make test, {label}: {shlex.join(cmd[2:])}", flush=True)
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT)
    while True:
        try:
            code = proc.wait()
            break
        except KeyboardInterrupt:
            INTERRUPTED.append(True)
    return code, time.monotonic() - t0


def main(argv: list[str]) -> int:
    workers = str((os.cpu_count() or 1) + 1)
    if argv[:1] == ["--workers"]:
        workers, argv = argv[1], argv[2:]
    pytest = [sys.executable, "-m", "pytest"]
    if own_selection(argv):
        return subprocess.call([*pytest, *argv], cwd=ROOT)
    slow_workers = os.environ.get("SLOW_WORKERS", "2")
    slow_dist = ["-n", slow_workers, "--dist", "loadscope"] if slow_workers not in ("0", "1") else []
    seed = order_seed(argv)
    if seed is not None:
        argv = [*argv, f"--randomly-seed={seed}"]
        print(f"=== make test: test order seed {seed} (replay: make test PYTEST_ARGS=\"-p randomly "
              f"--randomly-seed={seed}\")", flush=True)
    with tempfile.TemporaryDirectory(prefix="trajforge-suite-") as tmp:
        reports = [Path(tmp) / "fast.xml", Path(tmp) / "serial.xml"]
        tiers = [(f"fast tier ({workers} workers)",
                  [*pytest, f"--junitxml={reports[0]}", "-n", workers, "--dist", "worksteal", "-m", FAST, *argv]),
                 (f"Docker / Prefect / teacher tier ({slow_workers} workers)",
                  [*pytest, f"--junitxml={reports[1]}", *slow_dist, "-m", f"not ({FAST})", *argv])]
        results = [run(label, cmd) for label, cmd in tiers]
        code = combine([c for c, _ in results])
        total = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
        problems: list[str] = []
        print("\n=== make test: summary of both runs", flush=True)
        for (label, _), (c, wall), xml in zip(tiers, results, reports):
            counts, lines = outcomes(xml)
            for k, v in counts.items():
                total[k] += v
            problems += lines
            shown = ", ".join(f"{v} {k}" for k, v in counts.items() if v) or "no tests"
            print(f"{label}: exit code {c}, {shown}, {wall:.1f} s")
        for line in problems:
            print(line)
        shown = ", ".join(f"{v} {k}" for k, v in total.items() if v or k == "passed")
        given = next((a for a in argv if a.startswith("--randomly-seed")), None)
        if given:
            print(f"test order: {given} (replay: make test PYTEST_ARGS=\"-p randomly {given}\")")
        print(f"=== {shown} in {sum(w for _, w in results):.1f} s (exit code {code})", flush=True)
        return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
