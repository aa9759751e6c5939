"""Killing real `trajforge build` drivers and auditing what their resume leaves behind.

Shared by tests/test_chaos.py and benchmarks/chaos.py. A `Driver` is the CLI as a user runs it (a
subprocess: Prefect API server, Dask LocalCluster, real containers, replay teacher). It is killed
with SIGKILL *alone* (never its process group), as the OOM killer or a lost node would; its
descendants are recorded before, so that orphans (processes or containers) can be named after.
"""

from __future__ import annotations

import collections
import json
import os
import posixpath
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Callable

import psutil
import pyarrow.parquet as pq
import yaml
from helpers import small_config, venv_bin

from trajforge.tasks.engine.store import RunStore

TIMING_COLUMNS = {"wall_s", "created_at"}  # differ run to run (created_at: when the shard was written): the rest is content
STAGES = ("synthesize", "rollout", "verify", "calibrate", "export")


def chaos_config(runs: Path, dataset: str = "chaos") -> dict:
    """The small replay build of tests/helpers.py with one episode per rollout shard (4 shards: a kill
    can land between shards)."""
    return small_config(runs, dataset, **{"rollout.episodes_per_shard": 1, "dask.processes": True})


def write_config(folder: Path, cfg: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{cfg['dataset']}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


class Driver:
    """One `trajforge build CONFIG` subprocess. `seen` accumulates every descendant ever sampled."""

    def __init__(self, config: Path, log: Path):
        env = {**os.environ, "COLUMNS": "200"}
        env.pop("PREFECT_API_URL", None)  # the driver starts its own API server, as a user's does
        self.log = log
        self.t0 = time.monotonic()
        with open(log, "w") as out:
            self.proc = subprocess.Popen([venv_bin("trajforge"), "build", str(config)], cwd=config.parent, env=env,
                                         stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.seen: dict[int, psutil.Process] = {}
        self.killed_at: float | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def sample(self) -> list[psutil.Process]:
        """Record the current descendants (processes the driver started, directly or not)."""
        try:
            kids = psutil.Process(self.pid).children(recursive=True)
        except psutil.Error:
            return []
        for k in kids:
            self.seen.setdefault(k.pid, k)
        return kids

    def running(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> float:
        """SIGKILL the driver alone; returns seconds since it started."""
        self.sample()
        os.kill(self.pid, signal.SIGKILL)
        self.proc.wait()
        self.killed_at = time.monotonic() - self.t0
        return self.killed_at

    def wait(self, timeout: float = 900) -> int:
        """Wait for the driver to end on its own (sampling descendants meanwhile); its exit code."""
        deadline = time.monotonic() + timeout
        while self.running():
            if time.monotonic() > deadline:
                self.kill()
                raise TimeoutError(f"build did not end within {timeout:g}s; log: {self.tail()}")
            self.sample()
            time.sleep(0.2)
        return self.proc.returncode

    def tail(self, n: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-n:]

    def alive_descendants(self, grace_s: float = 0.0) -> list[psutil.Process]:
        """Recorded descendants still running (zombies awaiting their reaper count as gone)."""
        procs = list(self.seen.values())
        if grace_s:
            _, procs = psutil.wait_procs(procs, timeout=grace_s)
        out = []
        for p in procs:
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
            except psutil.NoSuchProcess:
                pass
        return out


def describe(procs: list[psutil.Process]) -> list[str]:
    out = []
    for p in procs:
        try:
            out.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
        except psutil.Error:
            out.append(str(p.pid))
    return out


def stage_status(store: RunStore, build_id: str) -> dict[str, str]:
    """{stage instance: status} from the build's `build.json` (written atomically by the driver)."""
    try:
        rec = store.read_json(posixpath.join(store.build_dir(build_id), "build.json"))
    except (FileNotFoundError, ValueError):
        return {}
    return {k: v.get("status", "") for k, v in rec.get("stages", {}).items()}


def newest_build(store: RunStore) -> str | None:
    builds = store.builds()
    return builds[-1] if builds else None


def wait_until(cond: Callable[[], object], driver: Driver, what: str, timeout: float = 600, every: float = 0.02):
    """Poll `cond` until truthy (returned); AssertionError if the driver ends first or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        if not driver.running():
            raise AssertionError(f"build ended (code {driver.proc.returncode}) before {what}:\n{driver.tail()}")
        driver.sample()
        time.sleep(every)
    raise AssertionError(f"no {what} within {timeout:g}s:\n{driver.tail()}")


def stage_dirs(store: RunStore, build_id: str, stage: str) -> list[str]:
    return store.fs.glob(posixpath.join(store.build_dir(build_id), stage, "*"))


def done_markers(store: RunStore, build_id: str, stage: str) -> list[str]:
    """The finished shards' markers of `stage` (a marker being written is a `*.tmp-*` file, renamed into place
    or removed by a resume: not a finished shard, and it may be gone by the time the caller looks at it)."""
    found = store.fs.glob(posixpath.join(store.build_dir(build_id), stage, "*", "_done", "*"))
    return [p for p in found if ".tmp-" not in posixpath.basename(p)]


def build_containers(client, build_id: str) -> list:
    return client.containers.list(all=True, filters={"label": f"trajforge.build={build_id}"}, sparse=True)


def orphan_containers(client, build_id: str | None, pids: set[int]) -> list[str]:
    """Names of containers left of a build (`trajforge.build`), or owned by one of `pids` on this host."""
    host = socket.gethostname()
    names = set()
    if build_id:
        names |= {c.attrs.get("Names", ["?"])[0] for c in build_containers(client, build_id)}
    for c in client.containers.list(all=True, filters={"label": "trajforge.owner"}, sparse=True):
        h, _, ident = (c.attrs.get("Labels") or {}).get("trajforge.owner", "").partition(":")
        pid = ident.partition(":")[0]
        if h == host and pid.isdigit() and int(pid) in pids:
            names.add(c.attrs.get("Names", ["?"])[0])
    return sorted(names)


def record(store: RunStore, build_id: str) -> dict:
    return store.read_json(posixpath.join(store.build_dir(build_id), "build.json"))


def rollout_ids(store: RunStore, build_id: str) -> collections.Counter:
    """Rollout ids in the committed rollout output of a build (a Counter: duplicates show as counts > 1)."""
    manifest = record(store, build_id)["stages"]["rollout"]["manifest"]
    parts = store.read_json(posixpath.join(manifest, "manifest.json"))["parts"]
    return collections.Counter(r for p in parts for r in pq.read_table(p, columns=["rollout_id"])
                               .column("rollout_id").to_pylist())


def export_content(store: RunStore, build_id: str) -> dict[str, list[str]]:
    """{export config: its rows as sorted canonical JSON, timing columns left out} of a build."""
    export = record(store, build_id)["stages"]["export"]["manifest"]
    out: dict[str, list[str]] = {}
    for f in sorted(store.fs.glob(posixpath.join(export, "*", "*.parquet"))):
        config = posixpath.basename(posixpath.dirname(f))
        rows = pq.read_table(f).to_pylist()
        out.setdefault(config, []).extend(
            json.dumps({k: v for k, v in r.items() if k not in TIMING_COLUMNS}, sort_keys=True, default=str)
            for r in rows)
    return {k: sorted(v) for k, v in out.items()}
