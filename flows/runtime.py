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

_server = None


def ensure_prefect_api() -> str:
    """Return the Prefect API URL, starting a local server for this process tree if none is set."""
    global _server
    url = os.environ.get("PREFECT_API_URL")
    if url:
        return url
    _server = _server_dying_with_parent()
    # The first start on a fresh machine creates and migrates the SQLite database: on 2 cores that
    # takes longer than Prefect's default 30 s startup timeout.
    _server.start(timeout=int(os.environ.get("TRAJFORGE_PREFECT_STARTUP_TIMEOUT", "240")))
    os.environ["PREFECT_API_URL"] = _server.api_url
    atexit.register(stop_prefect_api)
    return _server.api_url


def _server_dying_with_parent():
    """Prefect's `SubprocessASGIServer` whose uvicorn process gets SIGTERM when the process that
    started it dies (Linux `PR_SET_PDEATHSIG`): a SIGKILLed driver leaves no API server behind
    (atexit cannot run then). The signal follows the starting *thread*: start it from the main one."""
    import subprocess
    import sys
    import types

    from prefect.server.api import server as prefect_server

    from ..tasks.teachers.vllm_server import die_with_parent

    if not sys.platform.startswith("linux"):  # Prefect's own behaviour
        return prefect_server.SubprocessASGIServer()
    parent = os.getpid()

    def popen(args, *a, **kw) -> subprocess.Popen:  # an exec wrapper, never a `preexec_fn` (threads)
        return subprocess.Popen(die_with_parent(list(args), parent), *a, **kw)

    class Server(prefect_server.SubprocessASGIServer):
        def _run_uvicorn_command(self) -> subprocess.Popen:
            # Prefect builds the command itself: hand it a Popen that runs it behind the wrapper
            real = prefect_server.subprocess
            prefect_server.subprocess = types.SimpleNamespace(Popen=popen)
            try:
                return super()._run_uvicorn_command()
            finally:
                prefect_server.subprocess = real

    return Server()


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
    return getattr(context.task_runner, "address", None) if context is not None else None


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


def task_runner(address: str | None, n_workers: int, threads_per_worker: int):
    """DaskTaskRunner on a running scheduler (`address`) or a new LocalCluster of processes."""
    from prefect_dask import DaskTaskRunner

    if address:
        return DaskTaskRunner(address=address)
    return DaskTaskRunner(cluster_kwargs={"n_workers": n_workers, "threads_per_worker": threads_per_worker,
                                          "processes": True, "silence_logs": logging.ERROR,
                                          "dashboard_address": "127.0.0.1:0"})
