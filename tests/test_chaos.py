"""The chaos suite, driver and worker side: real `trajforge build` subprocesses (Prefect flow, Dask
LocalCluster, real containers, replay teacher) SIGKILLed inside each stage, then resumed with the same
command. Whatever the kill point, the resumed build has every rollout exactly once, exports the same
rows as an uninterrupted build of the same config, and leaves no process or container behind.
(Teacher faults, a full disk and concurrent builds of one config have their own test modules.)
"""

from __future__ import annotations

import os
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import chaos_kit as kit
import pytest

from trajforge.tasks.engine.store import RunStore

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, docker_client):
    """One uninterrupted CLI build of the chaos config, started at once in the background (it runs while the
    first test kills and resumes its own build: they share nothing but the engine); calling the fixture's value
    waits for it and gives (rollout ids, export content)."""
    folder = tmp_path_factory.mktemp("reference")
    cfg = kit.chaos_config(folder / "runs")
    driver = kit.Driver(kit.write_config(folder, cfg), folder / "build.log")
    pool = ThreadPoolExecutor(1)
    waited = pool.submit(driver.wait)  # samples the driver's descendants all along, as a foreground wait does
    done: list[tuple] = []

    def result() -> tuple:
        if not done:
            assert waited.result() == 0, driver.tail()
            store = RunStore(cfg["runs"], cfg["dataset"])
            build_id = kit.newest_build(store)
            assert kit.record(store, build_id)["status"] == "committed"
            assert driver.alive_descendants(grace_s=10) == [], "a normal build leaves no process behind"
            ids = kit.rollout_ids(store, build_id)
            assert len(ids) == 4 and set(ids.values()) == {1}
            done.append((ids, kit.export_content(store, build_id)))
        return done[0]
    yield result
    if driver.running():  # a test failed before it needed the reference
        driver.kill()
    pool.shutdown()


def _live_sandbox(client, build_id: str, role: str | None = None) -> bool:
    return any((role is None or (c.attrs.get("Labels") or {}).get("trajforge.role") == role)
               and c.attrs.get("State") == "running" for c in kit.build_containers(client, build_id))


@pytest.mark.long  # ~3 min (a kill and a resume per stage); a worker killed mid-shard: the test below
def test_driver_killed_inside_each_stage_then_resumed_loses_and_duplicates_nothing(tmp_path, docker_client,
                                                                                    reference):
    """One build, killed (SIGKILL of the driver alone) once inside each stage, each kill followed by a
    resume with the same command, the last resume running to the end."""
    cfg = kit.chaos_config(tmp_path / "runs")
    config = kit.write_config(tmp_path, cfg)
    store = RunStore(cfg["runs"], cfg["dataset"])
    # stage -> the point inside it where the driver dies (the stage is `running` in build.json)
    kill_points = {
        "synthesize": lambda b: _live_sandbox(docker_client, b),  # validating a reference solution
        "rollout": lambda b: kit.done_markers(store, b, "rollout"),  # some shards done, others in flight
        "verify": lambda b: _live_sandbox(docker_client, b, "verify"),
        "calibrate": lambda b: True,
        "export": lambda b: True,
    }
    drivers: list[kit.Driver] = []
    build_id = None
    rollout_done_before: dict[str, float] = {}
    for i, (stage, inside) in enumerate(kill_points.items()):
        driver = kit.Driver(config, tmp_path / f"run-{i}.log")
        drivers.append(driver)
        if build_id is None:
            build_id = kit.wait_until(lambda: kit.newest_build(store), driver, "a build folder")

        def at_kill_point(b: str = build_id, stage: str = stage, inside=inside) -> bool:
            return kit.stage_status(store, b).get(stage) == "running" and bool(inside(b))
        kit.wait_until(at_kill_point, driver, f"the kill point inside {stage}")
        driver.kill()
        assert kit.stage_status(store, build_id)[stage] == "running", f"the kill must land inside {stage}"
        if i:
            assert f"resuming unfinished build {build_id}" in driver.tail(20000)
        if stage == "rollout":
            rollout_done_before = {p: Path(p).stat().st_mtime for p in kit.done_markers(store, build_id, "rollout")}
            assert 1 <= len(rollout_done_before) < 4

    final = kit.Driver(config, tmp_path / "run-final.log")
    drivers.append(final)
    assert final.wait() == 0, final.tail()
    assert f"resuming unfinished build {build_id}" in final.tail(20000)
    assert kit.newest_build(store) == build_id  # every run resumed the one build
    assert kit.record(store, build_id)["status"] == "committed"
    for p, mtime in rollout_done_before.items():  # shards finished before a kill are never redone
        assert Path(p).stat().st_mtime == mtime

    ref_ids, ref_export = reference()
    ids = kit.rollout_ids(store, build_id)
    assert ids == ref_ids, f"lost {set(ref_ids) - set(ids)}, duplicated {[k for k, n in ids.items() if n > 1]}"
    assert kit.export_content(store, build_id) == ref_export

    seen = {pid for d in drivers for pid in d.seen}
    assert len(seen) >= 3 * len(drivers)  # each driver had its API server and Dask processes recorded
    alive = [p for d in drivers for p in d.alive_descendants(grace_s=10 if d is final else 0)]
    assert alive == [], f"processes outlived their driver: {kit.describe(alive)}"
    assert kit.orphan_containers(docker_client, build_id, seen | {d.pid for d in drivers}) == []


def test_dask_worker_killed_mid_shard_then_the_build_finishes_with_every_rollout_once(tmp_path, docker_client,
                                                                                       reference):
    cfg = kit.chaos_config(tmp_path / "runs")
    store = RunStore(cfg["runs"], cfg["dataset"])
    driver = kit.Driver(kit.write_config(tmp_path, cfg), tmp_path / "build.log")
    build_id = kit.wait_until(lambda: kit.newest_build(store), driver, "a build folder")

    def mid_shard() -> bool:  # a rollout shard has an episode in a live sandbox, not all shards are done
        return (kit.stage_status(store, build_id).get("rollout") == "running"
                and len(kit.done_markers(store, build_id, "rollout")) < 4 and _live_sandbox(docker_client, build_id))
    kit.wait_until(mid_shard, driver, "a rollout shard in flight")
    workers = [p for p in driver.sample() if "spawn_main" in " ".join(p.cmdline())]
    assert workers, f"no Dask worker process among {kit.describe(driver.sample())}"
    os.kill(workers[0].pid, signal.SIGKILL)

    assert driver.wait() == 0, driver.tail()
    assert kit.record(store, build_id)["status"] == "committed"
    ref_ids, ref_export = reference()
    ids = kit.rollout_ids(store, build_id)
    assert ids == ref_ids, f"lost {set(ref_ids) - set(ids)}, duplicated {[k for k, n in ids.items() if n > 1]}"
    assert kit.export_content(store, build_id) == ref_export
    assert driver.alive_descendants(grace_s=10) == []
    assert kit.orphan_containers(docker_client, build_id, set(driver.seen)) == []
