"""Teacher faults are teacher time, never the agent's: a real HTTP server that answers 429 with
Retry-After, 5xx, hangs or is slow (tests/fake_openai.py); episodes in real sandboxes; the managed
server's watchdog, pid file and parent-death signal with a stand-in server process."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from fake_openai import FakeOpenAI, fenced
from helpers import small_config

from trajforge.schemas.config import parse_config, teacher_config
from trajforge.schemas.environment import EnvSpec
from trajforge.schemas.trajectory import Message
from trajforge.tasks.agent.driver import run_episodes
from trajforge.tasks.engine import StageContext
from trajforge.tasks.teachers import TeacherError
from trajforge.tasks.teachers.openai import OpenAITeacher
from trajforge.tasks.teachers.vllm_server import VLLMServer, free_port, reap_orphans

SUITE_GROUP = "model"  # reaps orphaned teacher servers: never beside another module's (tests/conftest.py)

HERE = Path(__file__).resolve().parent


def teacher(url: str, **kw) -> OpenAITeacher:
    cfg = teacher_config({"backend": "openai", "endpoints": [url], "model": "fake", "tool_calling": False, **kw})
    return OpenAITeacher(cfg, cfg.all_endpoints())


def ask(t: OpenAITeacher):
    async def go():
        try:
            return await t.session(EnvSpec.model_construct(), 0, "r1").next_turn(
                [Message(role="user", content="hi")], [])
        finally:
            await t.aclose()
    return asyncio.run(go())


# ---- the client: Retry-After, jitter, what counts as a failure ------------------------------------------

def test_retry_after_is_honoured_and_429s_are_not_deaths():
    with FakeOpenAI("ok", sequence=["429", "503"], retry_after=1) as srv:
        t = teacher(srv.url, retries=0)  # neither a 429 nor a 503 with Retry-After uses up a retry
        turn = ask(t)
    assert srv.modes == ["429", "503", "ok"]
    assert srv.times[1] - srv.times[0] >= 1 and srv.times[2] - srv.times[1] >= 1
    assert t.endpoint_stats()[srv.url] == {"requests": 3, "errors": 0, "rate_limited": 2}
    assert turn.wait_s >= 2 and turn.message.content  # the waiting is reported as teacher time


def test_5xx_is_a_death_and_counts_against_retries():
    with FakeOpenAI("ok", sequence=["500"]) as srv:
        t = teacher(srv.url, retries=1)
        ask(t)
    assert t.endpoint_stats()[srv.url] == {"requests": 2, "errors": 1, "rate_limited": 0}
    with FakeOpenAI("500") as srv:
        t = teacher(srv.url, retries=1)
        with pytest.raises(TeacherError, match="failed after 2 attempt"):
            ask(t)
    assert srv.requests == 2


def test_429_then_5xx_then_a_hang_ends_in_teacher_error_within_max_wait():
    with FakeOpenAI("hang", sequence=["429", "500"], retry_after=0.5) as srv:
        t = teacher(srv.url, retries=5, max_wait_s=3, max_tokens=16, agent_tokens_per_s=16)
        with pytest.raises(TeacherError, match=r"no answer within teacher.max_wait_s=3s"):
            ask(t)
    assert srv.modes == ["429", "500", "hang"]
    assert t.endpoint_stats()[srv.url] == {"requests": 3, "errors": 2, "rate_limited": 1}


def test_retry_after_beyond_the_teacher_budget_fails_at_once():
    with FakeOpenAI("429", retry_after=3600) as srv:
        t = teacher(srv.url, max_wait_s=5)
        with pytest.raises(TeacherError, match="max_wait_s=5s"):
            ask(t)
    assert srv.requests == 1


def test_a_server_that_comes_back_is_waited_for_not_counted_as_failures():
    """Connection refused (a restarting server) is retried within max_wait_s, not against `retries`:
    an episode in flight retries its turn once the server is back."""
    port = free_port("127.0.0.1")
    later: dict = {}

    def come_back():
        time.sleep(2)
        later["srv"] = FakeOpenAI("ok", host="127.0.0.1", port=port).__enter__()

    th = threading.Thread(target=come_back)
    th.start()
    try:
        t = teacher(f"http://127.0.0.1:{port}/v1", retries=0, max_wait_s=60)
        turn = ask(t)
    finally:
        th.join()
        later["srv"].__exit__()
    assert turn.message.content and later["srv"].requests == 1
    stats = t.endpoint_stats()[f"http://127.0.0.1:{port}/v1"]
    assert stats["errors"] >= 1 and stats["requests"] == stats["errors"] + 1


# ---- the harness: teacher time never ends an episode as agent_timeout ------------------------------------

def ctx_for(tmp_path, url, episode_timeout_s, **teacher):
    cfg = small_config(tmp_path / "runs")
    cfg["teacher"] = {"backend": "openai", "endpoints": [url], "model": "fake", "tool_calling": False, **teacher}
    cfg["rollout"].update(max_turns=3, concurrency=4, command_timeout_s=10, episode_timeout_s=episode_timeout_s,
                          verify_in_place=False)
    return StageContext.create(parse_config(cfg), "b")


@pytest.mark.docker
def test_a_teacher_hanging_past_the_agent_budget_is_teacher_error(tmp_path, envs):
    with FakeOpenAI("hang") as srv:
        res = run_episodes(ctx_for(tmp_path, srv.url, 2, max_wait_s=4, max_tokens=16), envs,
                           [(e, 0) for e in sorted(envs)])
    assert [r.status for r in res.rows] == ["teacher_error"] * 2
    assert all("no answer within teacher.max_wait_s=4s" in r.error for r in res.rows)


@pytest.mark.docker
def test_a_slow_healthy_queue_does_not_eat_the_agent_budget(tmp_path, envs):
    """One request at a time, 2 s each, 2 episodes x 3 turns: each episode spends ~10 s waiting for the
    teacher, beyond its 6 s budget; only its commands and its generation at `agent_tokens_per_s` count."""
    with FakeOpenAI("ok", lambda req, n: fenced("echo hi"), delay_s=2) as srv:
        ctx = ctx_for(tmp_path, srv.url, 6, max_inflight_per_endpoint=1, agent_tokens_per_s=1000)
        res = run_episodes(ctx, envs, [(e, 0) for e in sorted(envs)])
    assert srv.max_inflight == 1 and srv.requests == 6
    assert [r.status for r in res.rows] == ["max_turns"] * 2
    assert all(r.wall_s > 6 for r in res.rows)  # the episodes did outlast the agent's budget
    assert res.stats["teacher_wait_seconds"] > 0
    assert res.stats["endpoint_rate_limited"] == {srv.url: 0}


# ---- the managed server: watchdog, pid file, parent-death signal (a stand-in server process) ------------

def stand_in(**vllm) -> object:
    """A `vllm` teacher whose server is tests/fake_openai.py run as a process, launched like vLLM."""
    extra = [str(a) for a in vllm.pop("args", [])]
    return teacher_config({"backend": "vllm", "model": "fake", "tool_calling": False, "vllm": {
        "command": [sys.executable, str(HERE / "fake_openai.py"), "--host", "{host}", "--port", "{port}", *extra],
        **vllm}})


def until(cond, limit_s: float = 180) -> bool:
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@contextlib.contextmanager
def watched(tmp_path, unhealthy_after_s: float):
    """A stand-in server (one restart allowed) under its watchdog: (server, the watchdog's notes, pid folder);
    stopped at the end, and no pid file may outlive it."""
    pids = tmp_path / "pids"
    server = VLLMServer(stand_in(health_interval_s=0.3, unhealthy_after_s=unhealthy_after_s, max_restarts=1),
                        tmp_path / "vllm.log", pid_dir=pids)
    notes: list[str] = []
    server.start()
    try:
        server.wait_healthy()
        server.watch(notes.append)
        yield server, notes, pids
    finally:
        server.unwatch()
        server.stop()
    assert not list(pids.glob("*.json"))


def test_watchdog_restarts_a_dead_server_at_the_same_url(tmp_path):
    with watched(tmp_path, unhealthy_after_s=60) as (server, notes, pids):
        first = server.proc.pid
        assert json.loads((pids / f"vllm-{first}.json").read_text())["pid"] == first
        os.kill(first, signal.SIGKILL)
        assert until(lambda: any("healthy again" in n for n in notes)), notes
        assert server.restarts == 1 and server.proc.pid != first
        assert any("exited with code -9; restarting it (1/1)" in n for n in notes)
        assert [p.name for p in pids.glob("*.json")] == [f"vllm-{server.proc.pid}.json"]
        assert ask(OpenAITeacher(server.cfg, [server.url])).message.content  # same URL as before


def test_watchdog_restarts_a_silent_server_then_gives_up_after_max_restarts(tmp_path):
    # unhealthy_after_s well above a busy machine's slowest /health answer: no restart but the ones caused here
    with watched(tmp_path, unhealthy_after_s=8) as (server, notes, _):
        silent = server.proc.pid
        os.kill(silent, signal.SIGSTOP)  # alive but silent
        assert until(lambda: any("healthy again" in n for n in notes)), notes
        assert server.restarts == 1 and any("has not answered /health" in n for n in notes) and not alive(silent)
        os.kill(server.proc.pid, signal.SIGKILL)
        assert until(lambda: any("not restarting" in n for n in notes)), notes
        assert server.restarts == 1 and not server.healthy()


def test_a_server_bound_to_one_address_is_reached_at_its_advertised_one(tmp_path):
    """Issue 30 item 3: the URL every worker dials is `teacher.vllm.advertise` (default: `host`), so a
    server bound to every interface of the driver's host is reached by that host's routable address."""
    server = VLLMServer(stand_in(host="127.0.0.1", advertise="localhost"), tmp_path / "vllm.log",
                        pid_dir=tmp_path / "pids")
    assert server.url == f"http://localhost:{server.port}/v1"
    server.start()
    try:
        server.wait_healthy()
        assert ask(OpenAITeacher(server.cfg, [server.url])).message.content
    finally:
        server.stop()
    with pytest.raises(ValueError, match=r"teacher\.vllm\.host '0\.0\.0\.0' binds every interface.*"
                                         r"set teacher\.vllm\.advertise"):
        stand_in(host="0.0.0.0")
    assert stand_in(host="0.0.0.0", advertise="10.0.0.2").vllm.url_host == "10.0.0.2"


def test_unwatch_during_a_restart_leaves_no_server_running(tmp_path):
    """The watchdog's restart and the service's unwatch()+stop() never interleave: an unwatch that
    arrives while the old process is being stopped means no new one is started (nothing is orphaned)."""
    server = VLLMServer(stand_in(health_interval_s=0.2, max_restarts=3), tmp_path / "vllm.log", pid_dir=tmp_path / "pids")
    notes: list[str] = []
    server.start()
    try:
        server.wait_healthy()
        first = server.proc.pid
        real_stop = server._stop

        def stop_then_unwatch(grace_s):  # the service's unwatch() lands in the middle of the restart
            real_stop(grace_s)
            if threading.current_thread().name == "trajforge-vllm-watchdog":
                server._watch_stop.set()

        server._stop = stop_then_unwatch
        server.watch(notes.append)
        os.kill(first, signal.SIGKILL)
        assert until(lambda: server.restarts == 1)
        server.unwatch()
        assert server.proc.pid == first and not alive(first), "no new server was started after unwatch"
    finally:
        server.unwatch()
        server.stop()
    assert not list((tmp_path / "pids").glob("*.json"))


@pytest.mark.timeout(180)  # max_wait_s is huge: a turn that waits for it instead of failing fast times out here
def test_once_the_watchdog_gives_up_turns_in_flight_and_new_ones_fail_fast(tmp_path):
    """Issue 15: a dead teacher must not cost `max_wait_s` per turn. The server hangs (SIGSTOP) with
    four turns in flight; the watchdog (no restarts left) stops it and publishes its death; every turn
    in flight ends as TeacherError, and a new turn fails without sending a request."""
    from trajforge.tasks.teachers.endpoints import read_dead_file

    cfg = stand_in(health_interval_s=0.3, unhealthy_after_s=1, max_restarts=0, args=["--delay-s", 3600])
    cfg = cfg.model_copy(update={"max_wait_s": 10 ** 6, "retries": 10 ** 6})
    server = VLLMServer(cfg, tmp_path / "vllm.log", pid_dir=tmp_path / "pids")
    dead = tmp_path / "teacher" / "vllm.dead.json"
    notes: list[str] = []

    def on_dead(why: str) -> None:
        dead.parent.mkdir(exist_ok=True)
        dead.write_text(json.dumps({"url": server.url, "why": why}))

    server.start()
    try:
        server.wait_healthy()
        t = OpenAITeacher(cfg, [server.url], dead_files={server.url: str(dead)})
        hung = server.proc.pid

        async def go():
            async def turn(i: int):
                return await t.session(EnvSpec.model_construct(), 0, f"r{i}").next_turn(
                    [Message(role="user", content="hi")], [])

            inflight = [asyncio.ensure_future(turn(i)) for i in range(4)]
            end = time.monotonic() + 60  # (a bound) until the four requests are in the server (answers in an hour)
            while sum(c.status == psutil.CONN_ESTABLISHED and c.laddr.port == server.port
                      for c in psutil.Process(hung).net_connections("tcp")) < 4:
                assert time.monotonic() < end, "the four requests never reached the stand-in server"
                await asyncio.sleep(0.05)
            os.kill(hung, signal.SIGSTOP)  # now it does not even answer /health
            server.watch(notes.append, on_dead=on_dead)
            done = await asyncio.gather(*inflight, return_exceptions=True)
            sent = t.endpoint_stats()[server.url]["requests"]
            try:
                await turn(9)
            except TeacherError as err:
                late = err
            return done, sent, late, t.endpoint_stats()[server.url]["requests"]

        try:
            done, sent, late, after = asyncio.run(go())
        finally:
            asyncio.run(t.aclose())
    finally:
        server.unwatch()
        server.stop()
    assert any("not restarting it" in n for n in notes) and server.dead and not alive(hung)
    assert read_dead_file(str(dead)) and "max_restarts=0" in read_dead_file(str(dead))
    assert [type(r) for r in done] == [TeacherError] * 4, done
    assert all("dead for good" in str(r) for r in done)
    assert "dead for good" in str(late) and after == sent, "a new turn sends no request to a dead server"


@pytest.mark.docker
def test_episodes_in_flight_retry_their_turn_after_the_server_is_restarted(tmp_path, envs):
    crashed = tmp_path / "crashed"
    cfg = stand_in(health_interval_s=0.3, args=["--delay-s", 0.3, "--die-after", 3, "--once-file", crashed])
    server = VLLMServer(cfg, tmp_path / "vllm.log", pid_dir=tmp_path / "pids")
    server.start()
    try:
        server.wait_healthy()
        server.watch()
        ctx = ctx_for(tmp_path, server.url, 120, retries=1, max_wait_s=120)
        res = run_episodes(ctx, envs, [(e, s) for e in sorted(envs) for s in range(2)])
    finally:
        server.unwatch()
        server.stop()
    assert crashed.exists() and server.restarts == 1  # the server did die mid-rollout
    assert [r.status for r in res.rows] == ["max_turns"] * 4 and all(r.turns == 3 for r in res.rows)
    assert sum(res.stats["endpoint_errors"].values()) >= 1


DRIVER = """
import json, os, sys, time
from pathlib import Path
from trajforge.schemas.config import teacher_config
from trajforge.tasks.teachers.vllm_server import VLLMServer
cfg, tmp, die_with_parent = teacher_config(json.loads(sys.argv[1])), Path(sys.argv[2]), sys.argv[3] == "1"
server = VLLMServer(cfg, tmp / "vllm.log", pid_dir=tmp / "pids", die_with_parent=die_with_parent)
server.start()
server.wait_healthy()
print(server.proc.pid, flush=True)
time.sleep(3600) if die_with_parent else os._exit(0)  # killed, or gone without stopping its server
"""


def driver(tmp_path, die_with_parent: bool) -> tuple[subprocess.Popen, int]:
    cfg = stand_in().model_dump(mode="json")
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, json.dumps(cfg), str(tmp_path), "1" if die_with_parent else "0"],
                            stdout=subprocess.PIPE, text=True)
    return proc, int(proc.stdout.readline())


def test_the_server_dies_with_its_driver(tmp_path):
    proc, server = driver(tmp_path, die_with_parent=True)
    assert alive(server)
    proc.kill()  # SIGKILL of the driver alone: the server is in its own session
    proc.wait()
    assert until(lambda: not alive(server)), "the server outlived its driver"
    assert reap_orphans(tmp_path / "pids") == [] and not list((tmp_path / "pids").glob("*.json"))


def test_an_orphaned_server_is_reaped_at_the_next_start(tmp_path):
    proc, orphan = driver(tmp_path, die_with_parent=False)  # as where no parent-death signal exists
    proc.wait()
    assert alive(orphan) and len(list((tmp_path / "pids").glob("*.json"))) == 1
    server = VLLMServer(stand_in(), tmp_path / "vllm.log", pid_dir=tmp_path / "pids")
    server.start()
    try:
        assert len(server.reaped) == 1
        assert re.fullmatch(rf"stopped orphaned server pid {orphan} \(http://127.0.0.1:\d+/v1\) of a build "
                            "that was killed", server.reaped[0])
        assert not alive(orphan)
        assert [p.name for p in (tmp_path / "pids").glob("*.json")] == [f"vllm-{server.proc.pid}.json"]
        assert reap_orphans(tmp_path / "pids") == []  # a live owner's server is never touched
        assert alive(server.proc.pid)
    finally:
        server.stop()


def test_a_pid_file_whose_pid_now_belongs_to_another_process_kills_nothing(tmp_path):
    other = subprocess.Popen(["sleep", "300"], start_new_session=True)
    gone = subprocess.Popen(["true"])
    gone.wait()
    try:
        started = psutil.Process(other.pid).create_time()
        pids = tmp_path / "pids"
        pids.mkdir()
        vllm = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--port", "8000"]
        owner = {"owner": gone.pid, "owner_started": started - 5, "url": "http://127.0.0.1:8000/v1"}
        (pids / "vllm-a.json").write_text(json.dumps({"pid": other.pid, "started": started - 100,
                                                      "cmdline": ["sleep", "300"], **owner}))  # another start time
        (pids / "vllm-b.json").write_text(json.dumps({"pid": other.pid, "started": started,
                                                      "cmdline": vllm, **owner}))  # another command line
        notes = reap_orphans(pids)
        assert alive(other.pid) and other.poll() is None
        assert len(notes) == 2 and all(n.startswith(f"left pid {other.pid} alone") for n in notes)
        assert not list(pids.glob("*.json"))
    finally:
        other.kill()
        other.wait()


@pytest.mark.docker
@pytest.mark.usefixtures("prefect_api")
def test_a_build_whose_server_crashes_mid_rollout_commits_no_teacher_error(tmp_path, capfd):
    """The whole path: the build's `teacher` service starts the (stand-in) server while the environments are made
    (issue 52: a CPU server's minute of start-up beside synthesize, not after it), waits for it when the rollout
    comes, its watchdog restarts it after it crashes mid-rollout, the episodes in flight retry their turn."""
    import glob
    import posixpath

    import pyarrow.parquet as pq

    from trajforge.flows.launch import run_build

    crashed = tmp_path / "crashed"
    teacher = stand_in(health_interval_s=0.3, args=["--delay-s", 0.2, "--die-after", 4, "--once-file", crashed])
    cfg = small_config(tmp_path / "runs", dataset="crash", **{
        "teacher": {**teacher.model_dump(mode="json", exclude_unset=True), "retries": 1, "max_wait_s": 120},
        "rollout.max_turns": 3, "rollout.concurrency": 4, "rollout.episodes_per_shard": 4})
    rec = run_build(parse_config(cfg))
    assert rec["status"] == "committed", rec.get("error")
    said = "".join(capfd.readouterr())
    order = [said.find(line) for line in ("teacher    starting vLLM", "synthesize running", "synthesize committed",
                                          "teacher    vLLM healthy", "rollout    running")]
    assert -1 not in order and order[0] < order[2] and order[2] < order[3], said[-3000:]
    assert crashed.exists(), "the server did crash mid-rollout"
    rows = [r for f in sorted(glob.glob(posixpath.join(rec["stages"]["rollout"]["manifest"], "part-*.parquet")))
            for r in pq.read_table(f, columns=["status"]).to_pylist()]
    assert len(rows) == 4 and {r["status"] for r in rows} == {"max_turns"}
    log = next((tmp_path / "runs" / "crash" / rec["build_id"] / "teacher").glob("vllm-*.log")).read_text()
    assert log.count("$ ") == 2  # started once, restarted once


@pytest.mark.docker
@pytest.mark.usefixtures("prefect_api")
def test_a_teacher_that_dies_while_environments_are_made_fails_the_build_at_once_naming_why(tmp_path):
    """Bad input (issue 52): the server begun early exits during start-up (here its launcher is given an argument
    it refuses): the build fails while the environments are still being made, naming the exit code and the
    server's own words, never waiting for the rollout or `startup_timeout_s` (an hour here); nothing is left
    running. (The stand-in refuses a delay that is no number.)"""
    from trajforge.flows.launch import run_build

    teacher = stand_in(startup_timeout_s=3600, args=["--delay-s", "soon"])
    cfg = small_config(tmp_path / "runs", dataset="early", **{
        "teacher": teacher.model_dump(mode="json", exclude_unset=True)})
    with pytest.raises(RuntimeError) as failed:
        run_build(parse_config(cfg))
    error = str(failed.value)
    assert re.search(r"teacher service, started early while stage (propose|synthesize) ran, failed: "
                     r"vLLM server exited with code 2 during start-up", error), error
    assert "argument --delay-s: invalid float value: 'soon'" in error, error
    [record] = [json.loads(p.read_text()) for p in (tmp_path / "runs" / "early").glob("*/build.json")]
    assert record["status"] == "failed" and "started early" in record["error"]
    assert "rollout" not in record["stages"], record["stages"]  # (the stage it was in reads `failed`: deployments.py)
    from trajforge.tasks.engine.cache import cache_root

    left = [f for f in (cache_root() / "servers").glob("vllm-*.json") if '"soon"' in f.read_text()]
    assert left == [], "the early server's pid file outlived the build"
