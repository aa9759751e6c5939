"""Fleet limits (issue 30 item 4): a build's sandboxes alive and created per second, shared by every
worker of the build (`sandbox.fleet`, tasks/sandbox/fleet.py): per event loop, across the worker
processes of a real Dask cluster, and in a real build whose sandboxes are counted on the engine."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from helpers import run_cli, small_config

from trajforge.schemas.config import FleetConfig, parse_config
from trajforge.tasks.engine.store import RunStore
from trajforge.tasks.sandbox.fleet import Fleet


def _episodes(fleet: Fleet, n: int, hold_s: float, log: list) -> None:
    """`n` episodes: each holds a sandbox slot, waits for a creation, lives `hold_s`; `log` gets
    (event, monotonic time) for grants and ends."""

    async def one() -> None:
        async with fleet.alive():
            log.append(("alive", time.monotonic()))
            await fleet.creation()
            log.append(("create", time.monotonic()))
            await asyncio.sleep(hold_s)
            log.append(("end", time.monotonic()))

    async def main() -> None:
        await asyncio.gather(*(one() for _ in range(n)))
        await fleet.aclose()

    asyncio.run(main())


def _most_alive(log: list) -> int:
    alive = most = 0
    for event, _ in sorted(log, key=lambda e: (e[1], e[0] != "end")):  # an end before a grant at the same time
        alive += {"alive": 1, "end": -1}.get(event, 0)
        most = max(most, alive)
    return most


def _densest(times: list[float], window: float) -> int:
    """The most creations in any half-open window of `window` seconds (a little slack for the clock)."""
    times = sorted(times)
    return max(sum(1 for u in times[i:] if u < t + window - 0.01) for i, t in enumerate(times))


def test_alive_and_creation_limits_hold_within_one_worker():
    log: list = []
    fleet = Fleet(FleetConfig(max_in_flight=3, creations_per_s=20, burst=2), "b1")
    _episodes(fleet, 12, 0.05, log)
    creations = [t for e, t in log if e == "create"]
    assert len(creations) == 12 and _most_alive(log) == 3
    assert _densest(creations, 2 / 20) <= 2  # burst 2 per 0.1 s window
    stats = fleet.stats()
    assert stats["fleet_creations"] == 12 and stats["fleet_wait_alive_s"] > 0 and stats["fleet_wait_create_s"] > 0


def test_no_limits_cost_nothing():
    log: list = []
    fleet = Fleet(FleetConfig(), "b1")
    _episodes(fleet, 8, 0.01, log)
    assert _most_alive(log) == 8
    assert fleet.stats() == {"fleet_creations": 8, "fleet_wait_alive_s": 0.0, "fleet_wait_create_s": 0.0}


def _worker_episodes(cfg: dict, build_id: str, n: int, hold_s: float) -> list:
    """Run in a Dask worker: the limiter there is the flow's cluster-wide one."""
    from trajforge.flows.runtime import cluster_limiter

    limiter = cluster_limiter()
    assert limiter is not None, "not inside a Dask worker"
    log: list = []
    _episodes(Fleet(FleetConfig(**cfg), build_id, limiter), n, hold_s, log)
    return [(event, t + time.time() - time.monotonic()) for event, t in log]  # wall clock: comparable across processes


@pytest.mark.slow
def test_limits_are_shared_by_the_workers_of_a_real_dask_cluster():
    """Two worker processes, six episodes each: together never more than the build's cap alive, nor
    more than `burst` creations in any window; another build's limits are its own."""
    import sys

    import cloudpickle
    from distributed import Client, LocalCluster

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import a test module
    cfg = {"max_in_flight": 3, "creations_per_s": 10, "burst": 2}
    with LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        workers = list(client.scheduler_info()["workers"])
        futures = [client.submit(_worker_episodes, cfg, "b1", 6, 0.3, workers=[w], pure=False) for w in workers]
        other = client.submit(_worker_episodes, {"max_in_flight": 1}, "b2", 2, 0.05, workers=[workers[0]], pure=False)
        logs = client.gather(futures)
        assert _most_alive(other.result()) == 1
    both = logs[0] + logs[1]
    assert all(any(e == "create" for e, _ in log) for log in logs)  # both workers ran episodes
    assert _most_alive(both) == 3, "the cap binds across workers, and is reached"
    assert max(_most_alive(log) for log in logs) < 6
    assert _densest([t for e, t in both if e == "create"], 2 / 10) <= 2


def test_a_fleet_setting_is_checked_and_never_fingerprinted(tmp_path):
    cfg = parse_config(small_config(tmp_path / "runs", **{"sandbox.fleet": {"max_in_flight": 2}}))
    plain = parse_config(small_config(tmp_path / "runs"))
    from trajforge.schemas.config import fingerprint_view

    assert fingerprint_view(cfg.sandbox) == fingerprint_view(plain.sandbox)
    from trajforge.schemas.config import ConfigError

    with pytest.raises(ConfigError, match=r"sandbox\.fleet\.creations_per_s"):
        parse_config(small_config(tmp_path / "runs", **{"sandbox.fleet": {"creations_per_s": 0}}))


@pytest.mark.docker
def test_a_build_keeps_its_sandboxes_within_the_fleet_cap_on_the_engine(tmp_path, prefect_api_url):
    """A real build on a LocalCluster of two workers: the containers of its rollout, counted on the
    Docker engine while it runs, never exceed `max_in_flight`; `trajforge status` shows the limits
    and what they cost."""
    import docker
    import yaml

    runs = tmp_path / "runs"
    config = small_config(runs, **{"sandbox.fleet": {"max_in_flight": 2, "creations_per_s": 4, "burst": 1},
                                   "rollout.samples_per_env": 4, "rollout.concurrency": 4,
                                   "dask": {"n_workers": 2, "threads_per_worker": 2}})
    (tmp_path / "build.yaml").write_text(yaml.safe_dump(config))
    client, seen, done = docker.from_env(), [], threading.Event()

    def count() -> None:
        while not done.is_set():
            # the list call alone (containers.list inspects each one after: a container removed in between raised
            # NotFound in this thread, which then stopped counting while the build went on)
            boxes = client.api.containers(filters={"label": "trajforge.env"})
            seen.append([(c.get("Labels") or {}).get("trajforge.build") for c in boxes])
            time.sleep(0.05)

    watcher = threading.Thread(target=count, daemon=True)
    watcher.start()
    try:
        build = run_cli("build", str(tmp_path / "build.yaml"), cwd=tmp_path, prefect_api=prefect_api_url)
    finally:
        done.set()
        watcher.join()
    assert build.returncode == 0, build.stdout + build.stderr
    ours = set(RunStore(str(runs), "t").builds())
    assert len(ours) == 1
    per_poll = [sum(b in ours for b in poll) for poll in seen if poll]
    assert per_poll and max(per_poll) <= 2, max(per_poll or [0])
    status = run_cli("status", "--runs", str(runs), cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    line = " ".join(status.stdout.split())
    assert "fleet limits (sandbox.fleet): max_in_flight=2, creations_per_s=4.0 (burst 1); rollout created 8 " \
           "sandboxes" in line, line
