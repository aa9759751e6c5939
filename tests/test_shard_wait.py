"""How the driver waits for a stage's shards (`flows.build._Arrivals`): Dask's own done-callbacks and a
plain event, never Prefect's `wait(timeout=)`, whose timeout is an exception injected into the waiting
thread (a SIGALRM handler, or `PyThreadState_SetAsyncExc` off the main thread) that can land inside
`threading`'s lock handling: it once failed a build with "release unlocked lock" while a host died."""

from __future__ import annotations

import time
import uuid

import pytest

pytestmark = pytest.mark.slow  # an in-process Dask cluster


def _nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def test_every_shard_is_seen_finishing_without_an_injected_timeout(monkeypatch):
    import prefect.utilities.timeout as prefect_timeout
    from distributed import Client
    from prefect_dask.task_runners import PrefectDaskFuture

    from trajforge.flows.build import _Arrivals  # (here: collecting the fast tier must not import Prefect)

    armed: list[float | None] = []

    def refuse(timeout=None, name=None):
        armed.append(timeout)
        raise AssertionError("waiting for shards armed an asynchronous timeout")

    monkeypatch.setattr(prefect_timeout, "cancel_sync_after", refuse)
    with Client(processes=False, n_workers=1, threads_per_worker=3, dashboard_address=None) as client:
        naps = {0.2: None, 1.5: None, 2.6: None}
        futures = {PrefectDaskFuture(task_run_id=uuid.uuid4(), wrapped_future=client.submit(_nap, s, pure=False)): s
                   for s in naps}
        arrivals, pending, t0 = _Arrivals(futures), set(futures), time.monotonic()
        rounds = 0
        while pending:
            done, pending = arrivals.wait(pending, timeout=1.0)
            rounds += 1
            for fut in done:
                naps[futures[fut]] = time.monotonic() - t0
                assert fut.wrapped_future.result() == futures[fut]
            assert rounds < 20, "the shards never all finished"
        assert armed == []
        for nap, seen in naps.items():  # each seen once it finished, within the time a wake-up takes
            assert nap <= seen < nap + 1.0, naps
        key = next(iter(futures)).wrapped_future.key
        next(iter(futures)).wrapped_future.release()  # what the driver does once a shard's result is read
        deadline = time.monotonic() + 10
        while key in client.refcount and time.monotonic() < deadline:
            time.sleep(0.05)
        assert key not in client.refcount, "a released shard future is still held (a dead worker would recompute it)"
