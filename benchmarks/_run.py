"""Run every benchmark (`benchmarks/*.py` except the `_*.py` helpers), one after another, each in its own
process, never stopping at a failure; then print a summary table. `make bench` runs it on the defaults,
`make bench-quick` with `--quick` passed to each benchmark (tiny sizes, what CI runs).

A benchmark's exit code says what happened (benchmarks/README.md): 0 ran (its targets met, not judged in
quick mode, or it has none), 3 (`_common.MISSED`) ran and missed a target, anything else (a crash, a
time-out, a signal) broke; one not started because `--budget` was spent is broken too (`skipped`). The summary takes each benchmark's `target: ...` lines for its target column.
Exit code: 1 if any benchmark broke, else 0 (missed targets are reported, not asserted).

Usage: python benchmarks/_run.py [--quick] [--only NAME ...] [--timeout S] [--budget S]
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MISSED = 3  # as benchmarks/_common.py (not imported: the runner needs no trajforge)


def run_one(path: Path, quick: bool, timeout: float) -> tuple[int | str, float, list[str]]:
    """(exit code or `timeout`, wall s, its `target:` lines); its output streams through as it comes."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, str(path), *(["--quick"] if quick else [])]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True, cwd=HERE.parent)
    targets: list[str] = []

    def pump() -> None:
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            if line.startswith("target:"):
                targets.append(line[len("target:"):].strip())

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        code: int | str = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: the benchmark and what it started
        proc.wait()
        code = "timeout"
    except BaseException:  # the runner interrupted (Ctrl-C, SIGTERM): the benchmark's session goes with it
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    reader.join(10)
    return code, time.monotonic() - t0, targets


def short(target_line: str) -> str:
    """`FIGURE = VALUE (target OP BOUND; peer: ...): VERDICT` -> `FIGURE = VALUE (OP BOUND)` for the summary."""
    m = re.match(r"(.*?) \(target ([<>]=) ([^;)]+)", target_line)
    return f"{m[1]} ({m[2]} {m[3]})" if m else target_line


def verdict(code: int | str, targets: list[str], quick: bool) -> str:
    if code == 0:
        if not targets or all(t.startswith("none") for t in targets):
            return "no target"
        return "not judged (quick)" if quick else "met"
    if code == MISSED:
        return "MISSED"
    return "broken"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="pass --quick to every benchmark (tiny sizes)")
    ap.add_argument("--only", nargs="+", default=None, help="these benchmarks (names without .py)")
    ap.add_argument("--timeout", type=float, default=None,
                    help="seconds per benchmark before it is killed and counted broken (default 900 quick, 4 h full)")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds for the whole run: each benchmark gets at most what is left (CI)")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds through run_one, which kills its benchmark
    timeout = args.timeout or (900 if args.quick else 4 * 3600)
    paths = sorted(p for p in HERE.glob("*.py") if not p.name.startswith("_"))
    if args.only:
        unknown = set(args.only) - {p.stem for p in paths}
        if unknown:
            ap.error(f"no such benchmark: {', '.join(sorted(unknown))}")
        paths = [p for p in paths if p.stem in args.only]
    rows = []
    t0 = time.monotonic()
    for path in paths:
        left = args.budget - (time.monotonic() - t0) if args.budget else timeout
        if args.budget and left < 10:
            print(f"\n== {path.stem}: not started, the --budget of {args.budget:.0f}s is spent", flush=True)
            rows.append((path.stem, "skipped", 0.0, "broken", []))
            continue
        print(f"\n== {path.stem}{' --quick' if args.quick else ''}", flush=True)
        code, wall, targets = run_one(path, args.quick, min(timeout, left))
        rows.append((path.stem, code, wall, verdict(code, targets, args.quick), targets))
        print(f"== {path.stem}: exit {code} in {wall:.0f}s", flush=True)
    total = time.monotonic() - t0
    header = ["benchmark", "exit", "wall s", "target", "figures"]
    table = [[name, str(code), f"{wall:.0f}", v, "; ".join(short(t) for t in targets if not t.startswith("none")) or "-"]
             for name, code, wall, v, targets in rows]
    widths = [max(len(x) for x in col) for col in zip(header, *table)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    print(f"\nbenchmarks{' (quick mode: figures not comparable to targets)' if args.quick else ''}: "
          f"{len(rows)} in {total:.0f}s\n")
    print(line(header))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in table:
        print(line(r))
    broken = [name for name, _, _, v, _ in rows if v == "broken"]
    missed = [name for name, _, _, v, _ in rows if v == "MISSED"]
    print(f"\nbroken: {', '.join(broken) or 'none'}; targets missed: {', '.join(missed) or 'none'}")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
