"""One live build per build id: the lease in the run store (local and S3), its takeover when stale,
and real `trajforge build` processes racing for one config (the replay teacher keeps them cheap).
Crash hygiene: fsynced parts, stale temporaries removed, a full disk reported in one line, then resumed."""

from __future__ import annotations

import json
import os
import posixpath
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers import run_cli, small_config, venv_bin

from trajforge.tasks.engine.lease import Lease, LeaseHeld, LeaseInfo, LeaseLost, hold
from trajforge.tasks.engine.store import RunStore, StoreWriteError

HOLDER = """
import sys, time
from trajforge.tasks.engine.lease import hold
from trajforge.tasks.engine.store import RunStore
store = RunStore(sys.argv[1], sys.argv[2])
with hold(store, sys.argv[3], sys.argv[4]):
    if len(sys.argv) > 5:  # a live sandbox of the build, as a running stage has
        from trajforge.schemas.config import SandboxConfig
        from trajforge.tasks.sandbox import Sandbox, docker_client
        cfg = SandboxConfig()
        sb = Sandbox(docker_client(), cfg.base_image, cfg, labels={"trajforge.build": sys.argv[3]})
        sb.start()
        print(sb.name, flush=True)
    print("held", flush=True)
    time.sleep(600)
"""


def _holder(runs: str, dataset: str, build_id: str, config_hash: str = "", sandbox: bool = False) -> tuple:
    """A live process holding the lease of `build_id`; returns (process, sandbox name or None)."""
    args = [sys.executable, "-c", HOLDER, runs, dataset, build_id, config_hash] + (["sandbox"] if sandbox else [])
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    name = proc.stdout.readline().strip() if sandbox else None
    assert proc.stdout.readline().strip() == "held", "the holder did not take the lease"
    return proc, name


def _kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def _lease_file(store: RunStore, build_id: str) -> str:
    return posixpath.join(store.build_dir(build_id), "lease.json")


def test_a_live_holder_is_named_and_a_dead_one_is_taken_over(tmp_path):
    store = RunStore(str(tmp_path / "runs"), "ds")
    proc, _ = _holder(str(tmp_path / "runs"), "ds", "b1")
    try:
        with pytest.raises(LeaseHeld) as err:
            Lease(store, "b1").acquire()
        msg = str(err.value)
        assert f"held by process {proc.pid} on {socket.gethostname()} since " in msg and "\n" not in msg
        assert "already running" in msg and "nothing was started" in msg
    finally:
        _kill(proc)  # SIGKILL: the lease stays behind, its process gone
    said = []
    lease = Lease(store, "b1", say=said.append)
    info = lease.acquire()
    try:
        assert said and f"from process {proc.pid}" in said[0] and "its process is gone" in said[0]
        assert LeaseInfo.model_validate_json(store.read_text(_lease_file(store, "b1"))).token == info.token
    finally:
        lease.release()
    assert not store.exists(_lease_file(store, "b1"))


def _plant(store: RunStore, build_id: str, owner: str, heartbeat_age: float, refresh_s: float = 15) -> None:
    now = time.time()
    store.write_text(_lease_file(store, build_id), LeaseInfo(
        owner=owner, token="theirs", build_id=build_id, acquired_at=now - 3600, heartbeat_at=now - heartbeat_age,
        refresh_s=refresh_s).model_dump_json())


def test_another_hosts_lease_is_held_while_it_beats_and_stale_after(tmp_path):
    store = RunStore(str(tmp_path / "runs"), "ds")
    _plant(store, "b2", "elsewhere:4242:1.00", heartbeat_age=5)
    with pytest.raises(LeaseHeld, match="held by process 4242 on elsewhere"):
        Lease(store, "b2").acquire()
    _plant(store, "b2", "elsewhere:4242:1.00", heartbeat_age=61)  # > 4 x 15 s
    said = []
    with hold(store, "b2", say=said.append):
        assert "no heartbeat for 61 s" in said[0]
    assert not store.exists(_lease_file(store, "b2"))
    store.write_text(_lease_file(store, "b2"), "{half a lease")
    with hold(store, "b2", say=said.append):
        assert said[1].endswith("an unreadable lease file: it cannot be read")


def test_hold_is_reentrant_released_on_error_and_a_takeover_is_noticed(tmp_path):
    store = RunStore(str(tmp_path / "runs"), "ds")
    path = _lease_file(store, "b3")
    with pytest.raises(KeyError):
        with hold(store, "b3") as outer:
            with hold(store, "b3") as inner:  # the CLI, then the flow, in one process
                assert inner is outer
            assert store.exists(path), "the inner hold must not release the outer one"
            raise KeyError("boom")
    assert not store.exists(path), "released on failure"

    with hold(store, "b3", refresh_s=0.05) as lease:
        first = lease.info.heartbeat_at
        deadline = time.time() + 30
        while LeaseInfo.model_validate_json(store.read_text(path)).heartbeat_at == first:
            assert time.time() < deadline, "the heartbeat never refreshed"
            time.sleep(0.02)
        _plant(store, "b3", "elsewhere:7:1.00", heartbeat_age=0)  # another driver took it (thought us stale)
        while not lease.lost:
            assert time.time() < deadline, "the takeover went unnoticed"
            if LeaseInfo.model_validate_json(store.read_text(path)).token == lease.info.token:
                # our beat read the file before the plant and wrote after it (a file has no compare-and-swap):
                # the other driver's takeover happens again, as its next acquire would
                _plant(store, "b3", "elsewhere:7:1.00", heartbeat_age=0)
            time.sleep(0.02)
        with pytest.raises(LeaseLost, match="taken over by process 7 on elsewhere"):
            lease.check()
    assert LeaseInfo.model_validate_json(store.read_text(path)).token == "theirs", "never remove another's lease"


def test_lease_on_s3_is_exclusive(s3_url):
    store = RunStore(s3_url, "ds")
    assert store.create_exclusive(f"{store.root}/x", "1") and not store.create_exclusive(f"{store.root}/x", "2")
    assert store.read_text(f"{store.root}/x") == "1", "a conditional PUT never overwrites"
    proc, _ = _holder(s3_url, "ds", "b4")
    try:
        with pytest.raises(LeaseHeld, match=f"held by process {proc.pid} "):
            Lease(store, "b4").acquire()
    finally:
        _kill(proc)
    with hold(store, "b4", say=lambda m: None) as lease:
        assert LeaseInfo.model_validate_json(store.read_text(lease.path)).token == lease.info.token
    assert not store.exists(_lease_file(store, "b4"))


# -- real builds ------------------------------------------------------------------------------------

def _config(tmp_path: Path, dataset: str) -> tuple[Path, dict]:
    cfg = small_config(tmp_path / "runs", dataset=dataset, **{"dask.processes": True})  # SIGKILLed drivers
    path = tmp_path / f"{dataset}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, cfg


def _env(prefect_api: str | None = None) -> dict:
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("PREFECT_API_URL", None)
    if prefect_api:  # the session's server (conftest `prefect_api_url`): the build starts none of its own
        env["PREFECT_API_URL"] = prefect_api
    return env


@pytest.mark.docker
@pytest.mark.slow
def test_a_second_build_of_a_live_build_starts_nothing_and_reaps_none_of_its_sandboxes(tmp_path, docker_client,
                                                                                        prefect_api_url):
    """The holder's sandbox survives a refused second build; once the holder is SIGKILLed, the next
    build takes the lease over, reaps the dead holder's sandbox and commits."""
    from trajforge.flows.build import config_hash
    from trajforge.schemas.config import parse_config

    path, cfg = _config(tmp_path, "live")
    store = RunStore(cfg["runs"], "live")
    build_id = "20990101T000000Z-live"
    proc, sandbox = _holder(cfg["runs"], "live", build_id, config_hash(parse_config(cfg)), sandbox=True)
    try:
        out = run_cli("build", str(path), "--build", build_id, cwd=tmp_path)
        assert out.returncode == 1, out.stderr[-2000:]
        line = [x for x in out.stderr.splitlines() if x.startswith("error:")]
        assert len(line) == 1 and f"build {build_id} is already running: held by process {proc.pid}" in line[0]
        assert "Traceback" not in out.stderr and not store.exists(store.build_record_path(build_id))
        assert docker_client.containers.list(all=True, filters={"name": sandbox}), "the live holder's sandbox was reaped"
    finally:
        _kill(proc)
    out = run_cli("build", str(path), "--build", build_id, cwd=tmp_path, prefect_api=prefect_api_url)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"taking over build {build_id} from process {proc.pid}" in out.stderr and "its process is gone" in out.stderr
    assert not docker_client.containers.list(all=True, filters={"name": sandbox}), "the dead holder's sandbox stays"
    assert store.read_build(build_id).status == "committed" and not store.exists(_lease_file(store, build_id))


@pytest.mark.docker
@pytest.mark.slow
def test_two_concurrent_builds_of_one_config_run_exactly_one(tmp_path, docker_client, prefect_api_url):
    path, cfg = _config(tmp_path, "twice")
    store = RunStore(cfg["runs"], "twice")
    procs = [subprocess.Popen([venv_bin("trajforge"), "build", str(path)], cwd=tmp_path, env=_env(prefect_api_url),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    errs = [p.communicate(timeout=900)[1] for p in procs]
    codes = [p.returncode for p in procs]
    assert sorted(codes) == [0, 1], (codes, [e[-2000:] for e in errs])
    winner, loser = (0, 1) if codes[0] == 0 else (1, 0)
    assert f"is already running: held by process {procs[winner].pid} on {socket.gethostname()}" in errs[loser]
    assert "Traceback" not in errs[loser]
    assert len(store.builds()) == 1 and store.read_build(store.builds()[0]).status == "committed"
    assert set(os.listdir(store.root)) == {store.builds()[0], "latest"}, "the refused build leaves no folder behind"
    rollouts = json.loads(Path(store.build_record_path(store.builds()[0])).read_text())["stages"]["rollout"]
    assert rollouts["rows"] == 4


# -- crash hygiene ----------------------------------------------------------------------------------

def test_parts_are_fsynced_before_they_appear_and_old_temporaries_go(tmp_path, monkeypatch):
    from trajforge.schemas.common import Reject
    from trajforge.tasks.engine import store as store_mod

    store = RunStore(str(tmp_path / "runs"), "ds")
    synced = []
    real = store_mod._fsync
    monkeypatch.setattr(store_mod, "_fsync", lambda p: (synced.append((p, os.path.exists(p))), real(p)))
    part = posixpath.join(store.stage_dir("b", "verify", "fp"), "part-00000.parquet")
    store.write_records(part, Reject, [Reject(key="a", reason="r")])
    (tmp_file, existed), (folder, _) = synced
    assert ".tmp-" in tmp_file and existed and tmp_file.startswith(part) and folder == posixpath.dirname(part)
    old, young = part + ".tmp-0ld0ld00", part + ".tmp-y0ung000"
    for p in (old, young):
        Path(p).write_bytes(b"half a parquet file")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    assert store.clean_temporaries(store.build_dir("b"), older_than=time.time() - 60) == 1
    assert not os.path.exists(old) and os.path.exists(young) and os.path.exists(part)


def test_an_error_while_finishing_never_hides_the_first_one(monkeypatch):
    from trajforge.flows import build as build_mod

    class Stub:
        class record:
            finished_at = None

        class services:
            @staticmethod
            def close():
                raise OSError("services")

        @staticmethod
        def save():
            raise StoreWriteError("cannot write build.json: disk full")

    printed = []
    monkeypatch.setattr(build_mod.console, "print", lambda *a, **k: printed.append(a[0]))
    build_mod._finish(Stub, KeyError("first"))  # the first error propagates (the caller re-raises it)
    assert len(printed) == 2 and "services" in printed[0] and "cannot write build.json" in printed[1]
    with pytest.raises(OSError, match="services"):  # no error before: the first late one is the error
        build_mod._finish(Stub, None)


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs (needs root), unmounted afterwards."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("cannot mount a size-capped tmpfs here (needs root)")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


@pytest.mark.docker
@pytest.mark.slow
def test_a_full_disk_is_one_clear_line_then_the_build_resumes(tmp_path, small_disk, docker_client, prefect_api_url):
    cfg = small_config(small_disk / "runs", dataset="full")
    path = tmp_path / "full.yaml"
    path.write_text(yaml.safe_dump(cfg))
    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * (2048 - 200) * 1024)  # 200 KiB left: the build stops mid-way
    out = run_cli("build", str(path), cwd=tmp_path, prefect_api=prefect_api_url)
    assert out.returncode == 1, out.stderr[-3000:]
    errors = [x for x in out.stderr.splitlines() if x.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert f"cannot write {small_disk}/runs/full/" in errors[0] and "No space left on device" in errors[0]
    assert "free of 2.0 MiB there" in errors[0] and "run the same command again" in errors[0]
    assert not list(small_disk.rglob("*.tmp-*")), "a failed write leaves no temporary behind"
    store = RunStore(cfg["runs"], "full")
    build_id = store.builds()[-1]
    assert store.read_build(build_id).status in ("failed", "running")  # (saving "failed" may not fit either)
    assert not store.exists(_lease_file(store, build_id)), "the lease is released on failure"

    filler.unlink()
    stale = Path(store.build_dir(build_id)) / "build.json.tmp-deadbeef"  # as a killed writer leaves it
    stale.write_text("{")
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    out = run_cli("build", str(path), cwd=tmp_path, prefect_api=prefect_api_url)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"resuming unfinished build {build_id}" in out.stderr and "removed 1 temporary file(s)" in out.stderr
    rec = store.read_build(build_id)
    assert rec.status == "committed" and not stale.exists()
    ids = store.read_table(store.read_json(posixpath.join(rec.stages["rollout"].manifest, "manifest.json"))["parts"],
                           columns=["rollout_id"]).column("rollout_id").to_pylist()
    assert len(ids) == 4 == len(set(ids)) and rec.stages["export"].rows == 4
