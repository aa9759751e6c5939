"""Benchmark `shard_wait` (no speed target; a fault count): how the driver waits for a stage's shards,
side by side on the same never-finishing Dask future, N short waits each.

  prefect: `prefect.futures.wait([future], timeout=T)`, what the driver used before issue 30: its timeout
           is an exception injected into the waiting thread (a SIGALRM handler on the main thread), which
           can land anywhere, including inside `threading`'s own lock handling
  driver:  `flows.build._Arrivals.wait({future}, T)`: the Dask future's done-callback and a plain
           `threading.Event.wait`, nothing injected

It counts the exceptions that escaped a wait (a build would have failed on each; "release unlocked lock"
failed a two-host build while a host died) and those that landed in other code and were swallowed there
("Exception ignored in ..."). Target: 0 of either for the driver's waiter.

Usage: python benchmarks/shard_wait.py [--waits 20000] [--timeout 0.002] [--quick]
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import host_report, parse_quick, print_table, target  # noqa: E402


def _nap(seconds: float) -> None:
    time.sleep(seconds)


def _count(wait, n: int) -> tuple[float, collections.Counter, collections.Counter]:
    """(seconds, exceptions that escaped a wait, exceptions that landed elsewhere and were swallowed there:
    Python's "Exception ignored in ..." hook, e.g. a GC callback the injected timeout interrupted)."""
    escaped: collections.Counter = collections.Counter()
    swallowed: collections.Counter = collections.Counter()
    previous = sys.unraisablehook
    sys.unraisablehook = lambda u: swallowed.update([f"{u.exc_type.__name__} in {getattr(u.object, '__qualname__', u.object)!s:.60}"])
    t0 = time.monotonic()
    try:
        for _ in range(n):
            try:
                wait()
            except BaseException as err:  # noqa: BLE001 - what escapes is the figure
                escaped[f"{type(err).__name__}: {err}"] += 1
    finally:
        sys.unraisablehook = previous
    return time.monotonic() - t0, escaped, swallowed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--waits", type=int, default=20000)
    ap.add_argument("--timeout", type=float, default=0.002)
    args = parse_quick(ap, waits=500)
    host_report("start", args.quick)

    from distributed import Client
    from prefect.futures import wait as prefect_wait
    from prefect_dask.task_runners import PrefectDaskFuture

    from trajforge.flows.build import _Arrivals

    with Client(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None) as client:
        fut = PrefectDaskFuture(task_run_id=uuid.uuid4(), wrapped_future=client.submit(_nap, 3600, pure=False))
        arrivals = _Arrivals([fut])
        sides = {"prefect wait(timeout)": lambda: prefect_wait([fut], timeout=args.timeout),
                 "driver _Arrivals.wait": lambda: arrivals.wait({fut}, args.timeout)}
        rows, escapes = [], {}
        for name, wait in sides.items():
            took, escaped, swallowed = _count(wait, args.waits)
            escapes[name] = sum(escaped.values()) + sum(swallowed.values())
            rows.append([name, args.waits, f"{took:.1f}", sum(escaped.values()), sum(swallowed.values()),
                         "; ".join(f"{k} x{v}" for k, v in (escaped + swallowed).items())])
        print_table(f"{args.waits} waits of {args.timeout:g} s on a future that never finishes",
                    ["waiter", "waits", "s", "escaped", "swallowed elsewhere", "what"], rows)
        host_report("end", args.quick)
        code = target("exceptions the driver's waits let loose", escapes["driver _Arrivals.wait"], "<=", 0,
                      args.quick)
        sys.stdout.flush()
        os._exit(code)  # the never-finishing task: nothing to wait for at exit


if __name__ == "__main__":
    sys.exit(main())
