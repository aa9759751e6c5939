"""The run store a worker is given is absolute (issue 28): every shipped config says `runs: ./runs`, and a
Dask worker resolving that against its own working directory (the stack's state folder) looks for the
build's lease and writes its shards in another run store. The driver resolves it once; a worker refuses a
relative one. (The same, for real, on the stack: tests/test_deployments.py.)"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from trajforge.schemas.config import ConfigError, absolute_runs, load_config, runs_is_relative
from trajforge.tasks.engine.contract import StageContext

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def shipped(tmp_path, monkeypatch):
    """configs/replay.yaml, verbatim, in a folder of its own that is the current directory (the driver's)."""
    (tmp_path / "configs").mkdir()
    shutil.copyfile(ROOT / "configs" / "replay.yaml", tmp_path / "configs" / "replay.yaml")
    monkeypatch.chdir(tmp_path)
    cfg = load_config(Path("configs/replay.yaml"))
    assert cfg.runs == "./runs"  # what every shipped config says
    return cfg


def test_absolute_runs_resolves_local_paths_and_keeps_urls(tmp_path):
    assert absolute_runs("./runs", tmp_path) == str(tmp_path / "runs")
    assert absolute_runs("runs/../x", tmp_path) == str(tmp_path / "x")
    assert absolute_runs("file://./runs", tmp_path) == str(tmp_path / "runs")
    assert absolute_runs("file:///data/runs", tmp_path) == "/data/runs"
    assert absolute_runs("/data/runs") == "/data/runs"
    assert absolute_runs("~/runs") == os.path.expanduser("~/runs")
    for url in ("s3://bucket/runs", "memory://runs", "simplecache::s3://bucket/runs", "gs://b/r"):
        assert absolute_runs(url, tmp_path) == url and not runs_is_relative(url)
    assert runs_is_relative("./runs") and runs_is_relative("file://runs") and not runs_is_relative("/data/runs")


def test_worker_payload_carries_an_absolute_run_store(shipped, tmp_path, monkeypatch):
    driver = StageContext.create(shipped, "b1")
    payload = driver.payload()
    assert payload["config"]["runs"] == str(tmp_path / "runs")
    worker_dir = tmp_path / "elsewhere"  # a worker runs in another folder (the stack's state folder)
    worker_dir.mkdir()
    monkeypatch.chdir(worker_dir)
    worker = StageContext.from_payload(payload)
    assert worker.store.root == driver.store.root == str(tmp_path / "runs" / "replay")
    assert not (worker_dir / "runs").exists()


def test_worker_refuses_a_relative_run_store(shipped):
    payload = StageContext.create(shipped, "b1").payload()
    payload["config"]["runs"] = "./runs"  # what an older driver sent
    with pytest.raises(ConfigError, match=r"^runs: the run store './runs' is a relative path"):
        StageContext.from_payload(payload)


def test_the_driver_resolves_runs_before_the_flow_sees_the_config(shipped, tmp_path, monkeypatch):
    """`run_build` (the CLI's `build`, and the `trajforge-build` deployment in its working directory): the
    config the build flow is given (its flow-run parameters, what shard payloads are built from) is absolute."""
    from trajforge.flows import build as build_flow
    from trajforge.flows import launch

    seen: list = []
    monkeypatch.setattr(launch, "_run_claimed", lambda store, cfg, *a, **k: seen.append((store, cfg)) or {})
    launch.run_build(shipped)
    [(store, cfg)] = seen
    assert cfg.runs == str(tmp_path / "runs") and store.root == str(tmp_path / "runs" / "replay")

    flow_seen: list = []
    monkeypatch.setattr(build_flow, "_run_build", lambda config, *a, **k: flow_seen.append(config) or {})
    build_flow.run_build_flow(shipped.model_dump(mode="json"), "b2")  # called with the relative config
    assert flow_seen[0]["runs"] == str(tmp_path / "runs")
