"""Host probes of benchmarks/inflight_scale.py: wall time in sandbox operations (`Timers`, by patching
the classes the driver and harness call), CPU seconds per process group, memory and the fake teacher's
counters (`Monitor`), and time-weighted statistics of a step function (`weighted`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
import urllib.request
from collections import defaultdict
from pathlib import Path


def get_stats(url: str) -> dict:
    with urllib.request.urlopen(url + "/stats", timeout=30) as r:
        return json.loads(r.read())


class Timers:
    """Wall seconds spent in sandbox operations (summed over episodes), by patching the classes the
    driver and harness call; `open` counts containers started and not yet removed."""

    def __init__(self):
        from trajforge.tasks.agent import harness
        from trajforge.tasks.sandbox import container

        self.spent: dict[str, list[float]] = defaultdict(list)
        self.open = 0
        self.peak_open = 0
        self.ids: set[str] = set()  # this benchmark's running containers
        self.container_cpu = 0.0  # CPU seconds inside this benchmark's containers (their cgroups, read at removal)
        self.lock = threading.Lock()

        def timed(owner, attr: str, kind: str, delta: int = 0):
            fn = getattr(owner, attr)

            def wrapper(*a, **kw):
                t0 = time.monotonic()
                cid = getattr(getattr(a[0], "container", None), "id", None) if delta < 0 else None
                if cid:
                    with contextlib.suppress(OSError, ValueError):
                        used = int(Path(f"/sys/fs/cgroup/cpuacct/docker/{cid}/cpuacct.usage").read_text()) / 1e9
                        with self.lock:
                            self.container_cpu += used
                try:
                    return fn(*a, **kw)
                finally:
                    self.spent[kind].append(time.monotonic() - t0)
                    if delta:
                        with self.lock:
                            self.open += delta
                            self.peak_open = max(self.peak_open, self.open)
                            if delta > 0 and getattr(a[0], "container", None) is not None:
                                self.ids.add(a[0].container.id)
                            self.ids.discard(cid)
            setattr(owner, attr, wrapper)

        timed(container.Sandbox, "start", "container start", +1)
        timed(container.Sandbox, "close", "container remove", -1)
        timed(container.Sandbox, "settle", "settle (kill, changes, checksums)")
        timed(container.Sandbox, "get_archive", "capture (archives)")
        timed(harness, "capture_outside", "capture (archives)")
        timed(harness, "run_hidden_tests", "hidden tests in place")
        timed(container, "run_exec", "docker exec (every one)")

        def waits(fn):  # the time an episode's first command (or its end) waits for its container
            async def wrapper(ep, *a, **kw):
                if not ep.started.done():
                    t0 = time.monotonic()
                    await asyncio.wait([ep.started])
                    self.spent["start wait"].append(time.monotonic() - t0)
                return await fn(ep, *a, **kw)
            return wrapper

        harness._Episode.run = waits(harness._Episode.run)
        harness._Episode.finish = waits(harness._Episode.finish)

    def reset(self) -> None:
        self.spent.clear()
        self.peak_open = self.open
        self.container_cpu = 0.0


def _cpu_jiffies() -> tuple[int, int]:
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]
    return sum(v) - idle, sum(v)


def _containers_cpu_s() -> float:
    try:
        return int(Path("/sys/fs/cgroup/cpuacct/docker/cpuacct.usage").read_text()) / 1e9
    except OSError:
        return float("nan")


def _mem_used_mib() -> float:
    info = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":")
            info[k] = int(v.split()[0])
    return (info["MemTotal"] - info["MemAvailable"]) / 1024


class Monitor:
    """Samples every `every_s`: CPU seconds per process group (long-lived processes per pid, children
    included: a shim's reaped runc calls count), host memory, the fake teacher's counters."""

    def __init__(self, server_pid: int, url: str, timers: Timers, every_s: float = 0.5):
        import psutil

        self.psutil, self.url, self.every_s, self.timers = psutil, url, every_s, timers
        self.per_container = (0, 0.0, 0.0, 0.0)  # at the most containers: (n, rss, usage, shim rss) MiB each
        self.me, self.server = psutil.Process(os.getpid()), psutil.Process(server_pid)
        self.last: dict[tuple[int, float, str], float] = {}
        self.cpu: dict[str, float] = defaultdict(float)
        self.mem_peak = 0.0
        self.threads_peak = 0
        self.teacher: list[tuple[float, dict]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    @staticmethod
    def _total(t) -> float:
        return t.user + t.system + t.children_user + t.children_system

    @staticmethod
    def _groups(name: str, t) -> dict[str, float]:
        """dockerd, containerd (dockerd's child) and the shims (daemonized: parent 1). A shim reaps its
        runc calls AND, as subreaper, every process exec'd in its container, whose CPU the container's
        cgroup counts too: its children's CPU is kept apart (runc = that minus the cgroup's)."""
        if name in ("dockerd", "containerd"):
            return {name: t.user + t.system + t.children_user + t.children_system}
        if name.startswith("containerd-shim"):
            return {"containerd-shim": t.user + t.system, "shim children": t.children_user + t.children_system}
        return {}

    def sample(self) -> None:
        ids = set(self.timers.ids)
        shim_rss = 0.0
        for p in self.psutil.process_iter(["name", "create_time"]):
            name = p.info["name"] or ""
            if not name.startswith(("dockerd", "containerd")):
                continue
            try:
                if name.startswith("containerd-shim"):  # only the shims of this benchmark's containers
                    cmd = p.cmdline()
                    if "-id" not in cmd or cmd[cmd.index("-id") + 1] not in ids:
                        continue
                    shim_rss += p.memory_info().rss / 2**20
                groups = self._groups(name, p.cpu_times())
            except (self.psutil.Error, IndexError):
                continue
            for group, total in groups.items():
                key = (p.pid, p.info["create_time"], group)
                before = self.last.get(key)
                if before is not None:
                    self.cpu[group] += max(0.0, total - before)
                elif self.started:  # born during the run: all of its CPU counts
                    self.cpu[group] += total
                self.last[key] = total
        self.mem_peak = max(self.mem_peak, _mem_used_mib())
        if len(ids) > self.per_container[0]:
            rss = usage = 0.0
            for cid in ids:
                d = Path("/sys/fs/cgroup/memory/docker") / cid
                try:
                    usage += int((d / "memory.usage_in_bytes").read_text()) / 2**20
                    rss += next(int(line.split()[1]) for line in (d / "memory.stat").read_text().splitlines()
                                if line.startswith("total_rss ")) / 2**20
                except (OSError, StopIteration):
                    pass
            n = len(ids)
            self.per_container = (n, rss / n, usage / n, shim_rss / n)
        self.threads_peak = max(self.threads_peak, self.me.num_threads())
        try:
            self.teacher.append((time.monotonic(), get_stats(self.url)))
        except Exception:
            pass

    def _loop(self) -> None:
        while not self.stop.wait(self.every_s):
            self.sample()

    def __enter__(self) -> "Monitor":
        self.t0 = time.monotonic()
        self.jiffies0, self.containers0 = _cpu_jiffies(), _containers_cpu_s()
        self.me0, self.server0 = self._total(self.me.cpu_times()), self._total(self.server.cpu_times())
        self.mem0 = _mem_used_mib()
        self.load0 = os.getloadavg()
        self.started = False
        self.sample()
        self.started = True
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()
        self.sample()
        j1 = _cpu_jiffies()
        self.busy_frac = (j1[0] - self.jiffies0[0]) / max(1, j1[1] - self.jiffies0[1])
        self.wall = time.monotonic() - self.t0
        self.cpu["this driver"] = self._total(self.me.cpu_times()) - self.me0
        self.cpu["fake teacher"] = self._total(self.server.cpu_times()) - self.server0
        self.cpu["inside containers"] = self.timers.container_cpu  # this benchmark's containers only
        self.cpu["inside all containers"] = _containers_cpu_s() - self.containers0
        self.cpu["runc (est.)"] = max(0.0, self.cpu.pop("shim children", 0.0) - self.cpu["inside containers"])
        self.load1 = os.getloadavg()

    def teacher_between(self, a: float, b: float) -> tuple[float, float]:
        """(busy share, mean requests in flight) at the fake teacher between monotonic times a and b,
        from the samples nearest inside the window."""
        inside = [(t, s) for t, s in self.teacher if a - self.every_s <= t <= b + self.every_s]
        if len(inside) < 2:
            return float("nan"), float("nan")
        (ta, sa), (tb, sb) = inside[0], inside[-1]
        return (sb["busy_s"] - sa["busy_s"]) / (tb - ta), (sb["inflight_s"] - sa["inflight_s"]) / (tb - ta)


def weighted(series: list[tuple[float, int]], a: float, b: float) -> tuple[float, float]:
    """(time-weighted mean, time-weighted median) of a step function [(time, value)] on [a, b]."""
    pieces = []
    for (t, v), (t2, _) in zip(series, series[1:] + [(b, 0)]):
        lo, hi = max(t, a), min(t2, b)
        if hi > lo:
            pieces.append((v, hi - lo))
    total = sum(d for _, d in pieces)
    if not total:
        return float("nan"), float("nan")
    mean = sum(v * d for v, d in pieces) / total
    acc = 0.0
    for v, d in sorted(pieces):
        acc += d
        if acc >= total / 2:
            return mean, v
    return mean, pieces[-1][0]


def cpu_model() -> str:
    with open("/proc/cpuinfo") as f:
        return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "?")
