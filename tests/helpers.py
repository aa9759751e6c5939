"""Helpers for the tests (importable: `tests/` is on pytest's pythonpath)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def small_config(runs: Path, dataset: str = "t", **overrides) -> dict:
    cfg = {
        "dataset": dataset,
        "runs": str(runs),
        "synthesize": {"families": [{"name": "log_report", "levels": [1], "seeds": [0]},
                                    {"name": "file_search", "levels": [1], "seeds": [0]}]},
        "teacher": {"backend": "replay"},
        "rollout": {"samples_per_env": 2, "episodes_per_shard": 2, "max_turns": 6},
        # the workers as threads of the build (`dask.processes: false`): no worker process to start and import per
        # build (~4 s of each on two cores); the tests about worker processes (killed drivers and workers, a cap
        # across workers, leases) set `dask.processes: true`, the default
        "dask": {"n_workers": 1, "threads_per_worker": 2, "processes": False},
    }
    for key, value in overrides.items():
        node = cfg
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return cfg


def venv_bin(name: str) -> str:
    import sys

    return str(Path(sys.executable).parent / name)


def run_cli(*args: str, cwd: Path, env: dict | None = None, timeout: int = 600,
            prefect_api: str | None = None) -> subprocess.CompletedProcess:
    """`trajforge ARGS` in a subprocess. A build starts its own Prefect API server (10-30 s on 2 cores) unless
    `prefect_api` names one (conftest's `prefect_api_url`: the session's): then it attaches to that one, as a
    build given PREFECT_API_URL does."""
    full_env = {**os.environ, "COLUMNS": "200", **(env or {})}
    full_env.pop("PREFECT_API_URL", None)
    if prefect_api:
        full_env["PREFECT_API_URL"] = prefect_api
    proc = subprocess.Popen([venv_bin("trajforge"), *args], cwd=cwd, env=full_env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException as stop:  # past `timeout`, or the test itself stopped (pytest-timeout, Ctrl-C)
        # what it was waiting for: every thread's stack (flows/runtime.py registers SIGUSR1); then it is killed,
        # never left running beside the tests that come next
        proc.send_signal(signal.SIGUSR1)
        time.sleep(3)
        proc.kill()
        out, err = proc.communicate()
        timed_out = isinstance(stop, subprocess.TimeoutExpired)
        said = (f"trajforge {' '.join(args)} "
                + (f"still ran after {timeout} s" if timed_out else f"was stopped ({type(stop).__name__})")
                + f"; its stderr's end, with every thread's stack:\n{err[-12000:]}")
        if timed_out:
            raise AssertionError(said) from None
        print(said, file=sys.stderr, flush=True)
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def run_stage(stage, ctx, upstream: dict, **prepare_kw):
    """(plan, manifest) of one stage run in this process as a build runs it: prepared (`prepare_kw`: `force`,
    `retry`), each pending shard executed, committed; a plan that reuses a committed output returns that."""
    from trajforge.tasks.engine import commit, execute_shard, prepare

    plan = prepare(stage, ctx, upstream, **prepare_kw)
    if plan.reused is not None:
        return plan, plan.reused
    for shard in plan.pending:
        execute_shard(stage, ctx, plan.dir, shard, upstream)
    return plan, commit(stage, ctx, plan, upstream)
