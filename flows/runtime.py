"""Process-level plumbing shared by the CLI and the tests: the Prefect API and the Dask runner.

Prefect's default "ephemeral" mode starts one temporary API server per *process*, so every Dask
worker would start its own (~8 s each). We start one server in the driver and export
PREFECT_API_URL before the cluster spawns, so workers inherit it.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import faulthandler
import logging
import os
import signal
import subprocess
import sys
import threading
import time

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("PREFECT_LOGGING_TO_API_ENABLED", "false")  # the API server lives as long as the build
# a failed shard or build is reported once, as one line naming its cause (build.json keeps it too):
# not as Prefect's tracebacks of every task and flow run it passed through
os.environ.setdefault("PREFECT_LOGGING_LOGGERS_PREFECT_FLOW_RUNS_LEVEL", "CRITICAL")
os.environ.setdefault("PREFECT_LOGGING_LOGGERS_PREFECT_TASK_RUNS_LEVEL", "CRITICAL")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
os.environ.setdefault("DO_NOT_TRACK", "1")
# distributed configures its own loggers at INFO; a build's console shows our progress, not its chatter
os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "warning")

# `kill -USR1 PID` prints every thread's stack of a trajforge process to its stderr and lets it run on: what a
# build that seems stuck is waiting for (tests/helpers.run_cli sends it to a CLI run past its timeout)
if hasattr(signal, "SIGUSR1"):
    faulthandler.register(signal.SIGUSR1, all_threads=True, chain=False)

_server: "ApiServer | None" = None
_gx_warm: threading.Thread | None = None


def launch_prefect_api() -> None:
    """Start this process tree's Prefect API server without waiting for it (unless PREFECT_API_URL names one):
    it boots in its own process while this one imports and plans; `ensure_prefect_api` then waits for it.
    PREFECT_API_URL is set at once (its port is chosen here): Prefect reads its settings when it is imported."""
    global _server
    if os.environ.get("PREFECT_API_URL") or _server is not None:
        return
    _server = ApiServer()
    _server.launch()
    os.environ["PREFECT_API_URL"] = _server.api_url
    atexit.register(stop_prefect_api)


def ensure_prefect_api() -> str:
    """Return the Prefect API URL, starting a local server for this process tree if none is set, and waiting
    for the one `launch_prefect_api` started to answer."""
    launch_prefect_api()
    if _server is not None and not _server.running:
        try:
            # The first start on a fresh machine creates and migrates the SQLite database: on 2 cores that
            # takes longer than Prefect's default 30 s startup timeout.
            _server.start(timeout=int(os.environ.get("TRAJFORGE_PREFECT_STARTUP_TIMEOUT", "240")))
        except BaseException:
            stop_prefect_api()  # no PREFECT_API_URL left naming a server that is gone: a later call starts anew
            raise
    return os.environ["PREFECT_API_URL"]


def warm_gate() -> None:
    """Import Great Expectations (seconds of CPU) in a background thread while the driver waits on its API
    server and Dask workers: the first gate then finds it imported. Call it once the driver's own imports are
    done (a thread importing beside them could meet a half-made module)."""
    global _gx_warm
    if _gx_warm is None:
        _gx_warm = threading.Thread(target=_import_gx, name="trajforge-warm-gate", daemon=True)
        _gx_warm.start()


def _import_gx() -> None:
    with contextlib.suppress(Exception):  # the gate imports it again and says what is wrong
        import great_expectations  # noqa: F401


class ApiServer:
    """A Prefect API server in a subprocess, as Prefect's `SubprocessASGIServer` runs it (uvicorn serving
    `prefect.server.api.server:create_app`, UI off, ephemeral), without importing Prefect's server into this
    process (seconds of CPU a driver never uses) and in two steps: `launch` (no wait) and `start` (wait until
    `/health` answers, `timeout` s at most; a server that exits is an error naming its code and output's end).
    The uvicorn process gets SIGTERM when the thread that launched it dies (Linux `PR_SET_PDEATHSIG`): a
    SIGKILLed driver leaves no API server behind (atexit cannot run then); launch it from the main thread."""

    def __init__(self) -> None:
        self.port: int | None = None
        self.process: subprocess.Popen | None = None
        self._log = None
        self.running = False

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def launch(self) -> None:
        import importlib.util
        import tempfile
        from pathlib import Path

        from ..tasks.teachers.vllm_server import die_with_parent, free_port

        if self.process is not None:
            return
        spec = importlib.util.find_spec("prefect")
        if spec is None or spec.origin is None:
            raise RuntimeError("Prefect is not installed: `make setup` installs it")
        self.port = free_port("127.0.0.1")
        self._log = tempfile.TemporaryFile()
        cmd = [sys.executable, "-m", "uvicorn", "--app-dir", str(Path(spec.origin).parent.parent), "--factory",
               "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(self.port),
               "--log-level", "error", "--lifespan", "on"]
        env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}
        self.process = subprocess.Popen(die_with_parent(cmd, os.getpid()), env=env, stdout=self._log,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def start(self, timeout: float = 240) -> None:
        import urllib.request

        self.launch()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code is not None:  # (3: its port was taken between choosing and binding it)
                out = self._output()
                self.stop()
                raise RuntimeError(f"the Prefect API server (port {self.port}) exited with code {code} before it "
                                   f"answered: {out}")
            try:
                with urllib.request.urlopen(f"{self.api_url}/health", timeout=2) as r:
                    if r.status == 200:
                        self.running = True
                        return
            except OSError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"the Prefect API server did not answer within {timeout:g} s "
                           f"(TRAJFORGE_PREFECT_STARTUP_TIMEOUT): {self._output()}")

    def _output(self) -> str:
        if self._log is None:
            return ""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-2000:].strip() or "(no output)"

    def stop(self) -> None:
        proc, self.process, self.running = self.process, None, False
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None


def stop_prefect_api() -> None:
    global _server
    if _server is not None:
        try:
            _server.stop()
        finally:
            _server = None
            os.environ.pop("PREFECT_API_URL", None)


class ClusterLimiter:
    """A lease of a cluster-wide `distributed.Semaphore` per holder (registered in the task thread):
    e.g. the in-flight cap of one teacher endpoint across every worker of the cluster."""

    def __init__(self, name: str, cap: int):
        from distributed import Semaphore

        self.name, self.sem = name, Semaphore(max_leases=cap, name=name)
        self.sem.register()

    @contextlib.asynccontextmanager
    async def hold(self, timeout: float | None = None):
        """Hold one lease; TimeoutError if none frees up within `timeout` seconds. Cancel-safe: a lease
        the acquiring thread gets after its waiter was cancelled is released, never leaked."""
        acquiring = asyncio.ensure_future(asyncio.to_thread(self.sem.acquire, timeout))
        try:
            got = await asyncio.shield(acquiring)
        except asyncio.CancelledError:
            acquiring.add_done_callback(
                lambda f: (not f.cancelled() and f.exception() is None and f.result()
                           and asyncio.ensure_future(asyncio.to_thread(self.sem.release))))
            raise
        if not got:
            raise TimeoutError(f"no free lease of {self.name} within {timeout:g}s")
        try:
            yield
        finally:
            await asyncio.to_thread(self.sem.release)


def cluster_limiter():
    """`ClusterLimiter` inside a Dask worker, else None (stage code then limits per event loop)."""
    try:
        from distributed import get_worker

        get_worker()
    except (ImportError, ValueError):
        return None
    return ClusterLimiter


def flow_scheduler_address() -> str | None:
    """The address of the Dask scheduler the running flow's task runner attached to; None outside a
    flow run, or when the runner started its own local cluster (its workers share this host)."""
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    if context is None or getattr(context.task_runner, "local", False):
        return None
    return getattr(context.task_runner, "address", None)


def reap_on_workers(address: str, build_id: str | None = None, engine: str | None = None) -> dict[str, int]:
    """Reap leftover sandboxes on the host of every worker of the scheduler at `address` (sandboxes
    live on the engine of the worker that ran them, `engine` = the config's `sandbox.engine` unless the
    worker's $TRAJFORGE_DOCKER_HOST names another; the driver can only clean its own host).
    Returns {worker: containers removed}; a worker that cannot reach its engine reports -1."""
    from distributed import Client

    from ..tasks.sandbox import reap_here

    def safe(build_id: str | None, engine: str | None) -> int:
        try:
            return reap_here(build_id, engine)
        except Exception:
            return -1

    with Client(address, timeout=30) as c:
        return c.run(safe, build_id, engine)


def task_runner(address: str | None, n_workers: int, threads_per_worker: int, processes: bool = True,
                early: "EarlyCluster | None" = None):
    """DaskTaskRunner on a running scheduler (`address`), on the build's own local cluster started early
    (`early`: `LocalRunner`, which the flow's services treat as sharing this host), or a new LocalCluster (of
    processes, or of threads of this process) made when the flow starts."""
    from prefect_dask import DaskTaskRunner

    if address:
        return DaskTaskRunner(address=address)
    if early is not None:
        return local_runner_class()(address=early.address())
    return DaskTaskRunner(cluster_kwargs=cluster_kwargs(n_workers, threads_per_worker, processes))


def cluster_kwargs(n_workers: int, threads_per_worker: int, processes: bool) -> dict:
    return {"n_workers": n_workers, "threads_per_worker": threads_per_worker, "processes": processes,
            "silence_logs": logging.ERROR, "dashboard_address": "127.0.0.1:0"}


def local_runner_class():
    """DaskTaskRunner on the build's own local cluster: attached by address (Prefect duplicates a runner from its
    settings, so a cluster object would be lost), marked `local` so `flow_scheduler_address` says None (its
    workers share this host and its engine)."""
    from prefect_dask import DaskTaskRunner

    global _LocalRunner
    if _LocalRunner is None:
        _LocalRunner = type("LocalRunner", (DaskTaskRunner,), {"local": True, "__module__": __name__})
    return _LocalRunner


_LocalRunner = None


PRELOAD = "trajforge.flows.dask_warm"  # what the workers of a build's own cluster import as they start


class EarlyCluster:
    """The build's local Dask cluster, started in a thread as soon as the build is claimed: its worker processes
    start and import the stage modules (preload `flows/dask_warm.py`) while the driver waits for its Prefect API
    server. `address()` waits for it (a start that failed raises here, naming the cause); `close()` stops it
    (idempotent; the flow never owns it)."""

    def __init__(self, n_workers: int, threads_per_worker: int, processes: bool):
        self._kw = {**cluster_kwargs(n_workers, threads_per_worker, processes),
                    **({"preload": [PRELOAD]} if processes else {})}
        self._cluster = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._start, name="trajforge-early-cluster", daemon=True)
        self._thread.start()

    def _start(self) -> None:
        try:
            from distributed import LocalCluster

            self._cluster = LocalCluster(**self._kw)
        except BaseException as err:  # said by address(), in the driver's thread
            self._error = err

    def address(self) -> str:
        self._thread.join()
        if self._error is not None:
            causes, err = [], self._error
            while err is not None and len(causes) < 4:  # (Dask's "Nanny failed to start." hides the worker's cause)
                causes.append(f"{err.__class__.__name__}: {err}")
                err = err.__cause__ or err.__context__
            raise RuntimeError("the build's local Dask cluster did not start: " + " <- ".join(causes)) from self._error
        return self._cluster.scheduler_address

    def close(self) -> None:
        self._thread.join()
        cluster, self._cluster = self._cluster, None
        if cluster is not None:
            with contextlib.suppress(Exception):
                cluster.close(timeout=10)
