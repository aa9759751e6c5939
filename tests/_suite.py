"""`make test`: the whole suite as three pytest runs, one after the other, with one exit code and one summary.

1. The fast tier (the tests `make test-fast` runs: no Docker engine, no Prefect server, no teacher) on
   `-n WORKERS --dist worksteal`, as `make test-fast` runs it every day. Serially it takes ~3 min on 2 cores
   (a third of it waiting on real timeouts), on 3 workers ~1.
2. Every other test (marker `docker`, `slow`, `vllm` or `teacher`) but the embedded teacher's: serially by default;
   with `SLOW_WORKERS=N` (N > 1) on N workers with `--dist loadscope`, scheduled by group (tests/conftest.py `suite_group`): a whole module on one
   worker (its module fixtures set up once), the longest pending group first (tests/suite_durations.json).
   These tests mostly wait on containers, builds and servers. What they share across workers is scoped by what
   they made (build ids, container names, labels, pids); each worker has its own Prefect home and session
   servers. Not the default yet: on two cores the tests slowed each other (CPU-bound, not waiting: the tier took
   69 min on two workers against 76 serially) and two runs on two workers each failed tests that pass serially.
3. The embedded teacher's tests (`suite_group` "model": the modules that start vLLM or read its files, and the
   teacher-fault tests) serially, alone: vLLM's start is CPU-bound, and beside other tests on two cores it and
   they took twice as long (measured: 464 s instead of 183 s for one test).

The selections are complements (`-m M` and `-m "not (M)"`, the latter split by `TRAJFORGE_SUITE_PART`): every collected
test runs exactly once.
The extra arguments (`make test PYTEST_ARGS=...`) go to every run. An argument that selects by marker, sets
the workers or names a JUnit report itself (`-m`, `-n`, `--dist`, `--junitxml`) makes it one plain serial
`pytest ARGS` run instead, as `make test` was. A run that collects nothing (arguments naming tests of one tier only: pytest exit code 5)
counts as nothing to do while the other tier ran tests.

Order: with pytest-randomly installed (the dev extra) each run shuffles its modules, and the tests within each
module, from one seed; every run gets the same seed, printed first and last (`--randomly-seed=N` in the arguments
replays it, `-p no:randomly` keeps file order).

At the end: each run's outcome and wall time, the combined counts, every test that failed, errored or was skipped,
with its reason, and the `SLOWEST` slowest tests of all runs (from each run's JUnit XML). Exit code: 0 when every run passed (or one had nothing to
collect), else the first failing run's code.

Usage: python tests/_suite.py [--workers N] [PYTEST ARGS ...]
       python tests/_suite.py --record-durations SERIAL_XML   # tests/suite_durations.json from a run's report
With `TRAJFORGE_SUITE_REPORTS=DIR` every run's JUnit report is copied into DIR at the end (they are otherwise
temporary). The second tier's scheduler starts the longest groups first by tests/suite_durations.json.
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


def case_name(case: ET.Element) -> str:
    """A JUnit test case's id as pytest names it (`tests/test_x.py::test_y[param]`)."""
    return "::".join(p for p in (case.get("classname", "").replace(".", "/") + ".py", case.get("name", "")) if p)


def outcomes(xml: Path) -> tuple[dict[str, int], list[str]]:
    """Counts (passed, failed, error, skipped) and one `OUTCOME id - reason` line per test that did not pass,
    from a JUnit XML report."""
    counts = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
    lines: list[str] = []
    if not xml.exists():
        return counts, lines
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = case_name(case)
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


SLOWEST = 20  # the slowest tests `make test` names at the end, over every tier


def slowest(reports: list[tuple[str, Path]], n: int = SLOWEST) -> list[tuple[float, str, str]]:
    """(seconds, tier, test id) of the `n` slowest tests of the runs' JUnit reports (setup, call and teardown:
    the time pytest's report gives a test case), slowest first."""
    found: list[tuple[float, str, str]] = []
    for tier, xml in reports:
        if not xml.exists():
            continue
        for case in ET.parse(xml).getroot().iter("testcase"):
            found.append((float(case.get("time") or 0.0), tier, case_name(case)))
    return sorted(found, key=lambda t: -t[0])[:n]


def order_seed(args: list[str]) -> int | None:
    """A seed for every run's order when pytest-randomly is installed and the arguments neither give one nor turn
    it off (the two runs then shuffle alike, and one number replays both)."""
    import importlib.util
    import random

    if importlib.util.find_spec("pytest_randomly") is None or "no:randomly" in args or any(
            a.startswith("--randomly-seed") for a in args):
        return None
    return random.randrange(2**32)


INTERRUPTED: list[bool] = []


def run(label: str, cmd: list[str], env: dict[str, str] | None = None) -> tuple[int, float]:
    """The run's exit code and wall seconds. Ctrl-C reaches pytest too (one process group): it is waited for,
    so it can stop its servers and containers, and the next run is not started."""
    if INTERRUPTED:
        print(f"\n=== make test, {label}: not started (interrupted)", flush=True)
        return 2, 0.0
    print(f"\n=== make test, {label}: {shlex.join(cmd[2:])}", flush=True)
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, **(env or {})})
    while True:
        try:
            code = proc.wait()
            break
        except KeyboardInterrupt:
            INTERRUPTED.append(True)
    return code, time.monotonic() - t0


def record_durations(xml: Path, out: Path) -> dict[str, float]:
    """Seconds per test module (setup, call and teardown, as JUnit reports them) of a second-tier run, written
    to `out` sorted by module: what the scheduler in tests/conftest.py orders groups by."""
    import json

    seconds: dict[str, float] = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")
        path = "/".join(module[: next((i + 1 for i, part in enumerate(module) if part.startswith("test_")),
                                      len(module))]) + ".py"
        seconds[path] = seconds.get(path, 0.0) + float(case.get("time") or 0.0)
    table = {k: round(v, 1) for k, v in sorted(seconds.items())}
    out.write_text(json.dumps(table, indent=1) + "\n")
    return table


def main(argv: list[str]) -> int:
    if argv[:1] == ["--record-durations"] and len(argv) == 2:
        table = record_durations(Path(argv[1]), ROOT / "tests" / "suite_durations.json")
        print(f"tests/suite_durations.json: {len(table)} modules, {sum(table.values()):.0f} s")
        return 0
    workers = str((os.cpu_count() or 1) + 1)
    if argv[:1] == ["--workers"]:
        workers, argv = argv[1], argv[2:]
    pytest = [sys.executable, "-m", "pytest"]
    if own_selection(argv):
        return subprocess.call([*pytest, *argv], cwd=ROOT)
    slow_workers = os.environ.get("SLOW_WORKERS") or "1"
    slow_dist = ["-n", slow_workers, "--dist", "loadscope"] if slow_workers not in ("0", "1") else []
    seed = order_seed(argv)
    if seed is not None:
        argv = [*argv, f"--randomly-seed={seed}"]
        print(f"=== make test: test order seed {seed} (replay: make test PYTEST_ARGS=\"-p randomly "
              f"--randomly-seed={seed}\")", flush=True)
    with tempfile.TemporaryDirectory(prefix="trajforge-suite-") as tmp:
        reports = [Path(tmp) / "fast.xml", Path(tmp) / "serial.xml", Path(tmp) / "model.xml"]
        slow = f"not ({FAST})"
        tiers = [(f"fast tier ({workers} workers)",
                  [*pytest, f"--junitxml={reports[0]}", "-n", workers, "--dist", "worksteal", "-m", FAST, *argv], {}),
                 (f"Docker / Prefect tier ({slow_workers + ' workers' if slow_dist else 'serial'})",
                  [*pytest, f"--junitxml={reports[1]}", *slow_dist, "-m", slow, *argv], {"TRAJFORGE_SUITE_PART": "shared"}),
                 ("embedded-teacher tier (serial)",
                  [*pytest, f"--junitxml={reports[2]}", "-m", slow, *argv], {"TRAJFORGE_SUITE_PART": "model"})]
        results = [run(label, cmd, env) for label, cmd, env in tiers]
        code = combine([c for c, _ in results])
        total = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
        problems: list[str] = []
        print("\n=== make test: summary of the runs", flush=True)
        for (label, _, _), (c, wall), xml in zip(tiers, results, reports):
            counts, lines = outcomes(xml)
            for k, v in counts.items():
                total[k] += v
            problems += lines
            shown = ", ".join(f"{v} {k}" for k, v in counts.items() if v) or "no tests"
            print(f"{label}: exit code {c}, {shown}, {wall:.1f} s")
        for line in problems:
            print(line)
        top = slowest([(label.split(" (")[0], xml) for (label, _, _), xml in zip(tiers, reports)])
        if top:
            print(f"the {len(top)} slowest tests (s, tier, test):")
            for seconds, tier, name in top:
                print(f"{seconds:8.1f}  {tier:<26} {name}")
        shown = ", ".join(f"{v} {k}" for k, v in total.items() if v or k == "passed")
        given = next((a for a in argv if a.startswith("--randomly-seed")), None)
        if given:
            print(f"test order: {given} (replay: make test PYTEST_ARGS=\"-p randomly {given}\")")
        print(f"=== {shown} in {sum(w for _, w in results):.1f} s (exit code {code})", flush=True)
        keep = os.environ.get("TRAJFORGE_SUITE_REPORTS")
        if keep:
            import shutil

            Path(keep).mkdir(parents=True, exist_ok=True)
            for xml in reports:
                if xml.exists():
                    shutil.copy(xml, Path(keep) / xml.name)
        return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
