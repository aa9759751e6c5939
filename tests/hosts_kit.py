"""Two "hosts" on one machine for the tests and benchmarks/scale_out.py: `deploy/hosts/two-hosts.sh` driven
from Python, the build config both use (12 environments x 4 rollouts by default, a stand-in teacher that the
driver starts on the hub's address and that solves every other environment), and what a build committed."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import docker
import yaml

from trajforge.tasks.engine.store import RunStore
from trajforge.tasks.envs.families import get_family

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "deploy" / "hosts" / "two-hosts.sh"
HUB = "198.51.100.1"
FAMILIES = ("log_report", "file_search", "csv_convert")
SEEDS = (0, 1, 2, 3)


def netns_unavailable() -> str | None:
    """Why this machine cannot create network namespaces (None: it can)."""
    try:
        probe = subprocess.run(["ip", "netns", "add", f"tft-probe-{os.getpid()}"], capture_output=True, text=True)
    except FileNotFoundError:
        return "no `ip` command (iproute2; make setup installs it)"
    if probe.returncode != 0:
        return f"`ip netns add`: {probe.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", f"tft-probe-{os.getpid()}"], check=True)
    return None


class Hosts:
    """The hosts of `two-hosts.sh` under `state` (namespaces named `<prefix>-hub`, `-a`, `-b`)."""

    def __init__(self, state: Path, prefix: str = "tft"):
        self.state = state
        self.env = {**os.environ, "TF_HOSTS_STATE": str(state), "TF_HOSTS_PREFIX": prefix, "TF_PYTHON": sys.executable}
        self.env.pop("PREFECT_API_URL", None)

    def up(self) -> None:
        up = self.sh("up")
        if up.returncode != 0:
            self.sh("down")
            raise RuntimeError(f"two-hosts.sh up failed:\n{up.stdout}{up.stderr}{logs(self.state)}")

    def sh(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(SCRIPT), *args], env=self.env, capture_output=True, text=True,
                              timeout=timeout)

    def build(self, config: Path, background: bool = False):
        cmd = ["bash", str(SCRIPT), "run", "hub", str(Path(sys.executable).parent / "trajforge"), "build", str(config)]
        if background:
            return subprocess.Popen(cmd, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        return subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=1200)

    def engine(self, h: str) -> docker.DockerClient:
        return docker.DockerClient(base_url=f"unix://{self.state}/{h}/d.sock")


def logs(state: Path) -> str:
    return "".join(f"\n--- {p.name}\n{p.read_text()[-1500:]}" for p in sorted((state / "logs").glob("*.log")))


def config(tmp: Path, dataset: str, families=FAMILIES, seeds=SEEDS, samples: int = 4, **over) -> Path:
    """12 environments x 4 rollouts; a stand-in teacher that the driver starts on the hub's address, which
    solves every other environment (its reference solution) and fails the rest."""
    envs = [get_family(f).generate(1, s) for f in families for s in seeds]
    solutions = tmp / "solutions.jsonl"
    solutions.write_text("".join(json.dumps({"instruction": e.instruction, "commands": e.solution}) + "\n"
                                 for e in envs[::2]))
    cfg = {
        "dataset": dataset, "runs": str(tmp / "runs"),
        "synthesize": {"families": [{"name": f, "levels": [1], "seeds": list(seeds)} for f in families],
                       "dedup_threshold": None},
        "teacher": {"backend": "vllm", "model": "stand-in", "tool_calling": False, "vllm": {
            "host": HUB, "command": [sys.executable, str(ROOT / "tests" / "fake_openai.py"), "--host", "{host}",
                                     "--port", "{port}", "--solutions", str(solutions)]}},
        "rollout": {"samples_per_env": samples, "episodes_per_shard": 4, "max_turns": 2},
        "sandbox": {"registry": f"{HUB}:5000"},
        "dask": {"address": f"tcp://{HUB}:8786"},
    }
    for key, value in over.items():
        node = cfg
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        if value is None:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    path = tmp / f"{dataset}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def stats(runs: Path, dataset: str) -> dict[str, dict]:
    """Each stage's stats in the latest build, with its committed row count as `rows_out`."""
    store = RunStore(str(runs), dataset)
    rec = store.read_build(store.latest())
    assert rec.status == "committed", rec
    return {name: {**store.read_json(f"{e.manifest}/manifest.json")["stats"], "rows_out": e.rows}
            for name, e in rec.stages.items()}


def rollout_ids(runs: Path, dataset: str) -> list[str]:
    import pyarrow.parquet as pq

    store = RunStore(str(runs), dataset)
    rec = store.read_build(store.latest())
    parts = sorted(Path(rec.stages["rollout"].manifest).glob("part-*.parquet"))
    return [r for p in parts for r in pq.read_table(p, columns=["rollout_id"]).column("rollout_id").to_pylist()]




@contextlib.contextmanager
def in_new_netns(name: str, address: str):
    """This thread (and the processes and threads it starts) inside a new network namespace `name` whose only
    interfaces are its loopback and a veth pair, one end holding `address`/24; back in the namespace it was in after.
    Skips the test where namespaces cannot be created. setns(2) acts on the calling thread only: the test's
    own threads started before stay where they were."""
    import ctypes

    import pytest

    why = netns_unavailable()
    if why:
        pytest.skip(f"this machine cannot create network namespaces ({why})")
    ip = lambda *a: subprocess.run(["ip", *a], check=True, capture_output=True)  # noqa: E731
    ip("netns", "add", name)
    try:
        ip("-n", name, "link", "set", "lo", "up")
        ip("-n", name, "link", "add", "v0", "type", "veth", "peer", "name", "v1")  # (no dummy module everywhere)
        ip("-n", name, "addr", "add", f"{address}/24", "dev", "v0")
        ip("-n", name, "link", "set", "v0", "up")
        ip("-n", name, "link", "set", "v1", "up")
        libc = ctypes.CDLL(None, use_errno=True)
        back = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        there = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
        try:
            if libc.setns(there, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns into {name}")
            try:
                yield address
            finally:
                if libc.setns(back, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns back")
        finally:
            os.close(there)
            os.close(back)
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


CLONE_NEWNET = 0x40000000


class Sandboxes:
    """The rollout sandboxes (label `trajforge.env`) each engine ran while this watch was open, by container id,
    polled every 50 ms (an engine keeps only its last 256 events: too few to count a build's containers)."""

    def __init__(self, engines: dict[str, docker.DockerClient]):
        import threading

        self.engines, self.seen = engines, {name: set() for name in engines}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.is_set():
            for name, client in self.engines.items():
                try:
                    self.seen[name] |= {c.id for c in client.containers.list(
                        all=True, sparse=True, filters={"label": "trajforge.env"})}
                except Exception:  # an engine that died (a killed host): nothing more to see there
                    pass
            self._stop.wait(0.05)

    def __enter__(self) -> "Sandboxes":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)

    def counts(self) -> dict[str, int]:
        return {name: len(ids) for name, ids in self.seen.items()}
