"""`trajforge doctor`: the real CLI against the real engine, a dead engine, and real endpoints."""

import socket
from pathlib import Path

import pytest
from fake_openai import FakeOpenAI
from helpers import run_cli

from trajforge.flows.doctor import cpu_check, network_checks, teacher_check
from trajforge.schemas.config import teacher_config

ROOT_CONFIG = "configs/replay.yaml"


def _row(stdout: str, name: str) -> str:
    """The status cell of the table row whose first cell is `name`."""
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.split("│")]
        if len(cells) > 2 and cells[1] == name:
            return cells[2]
    raise AssertionError(f"no row {name!r} in:\n{stdout}")


@pytest.mark.docker
def test_doctor_reports_the_engine_and_base_image_ok(tmp_path):
    from conftest import ROOT

    r = run_cli("doctor", str(ROOT / ROOT_CONFIG), cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert _row(r.stdout, "docker engine") == "ok"
    assert _row(r.stdout, "base image") == "ok"
    assert _row(r.stdout, "storage") in ("ok", "warn")  # warn: the driver cannot cap (said in the row)
    assert _row(r.stdout, "teacher replay") == "ok"
    assert [_row(r.stdout, f"network: {phase}") for phase in ("build", "agent", "verifier")] == ["ok"] * 3


def test_doctor_fails_without_an_engine(tmp_path):
    from conftest import ROOT

    r = run_cli("doctor", str(ROOT / ROOT_CONFIG), cwd=tmp_path, env={"DOCKER_HOST": "unix:///nonexistent"},
                timeout=120)
    assert r.returncode != 0
    assert _row(r.stdout, "docker engine") == "fail"
    assert "check(s) failed: docker engine" in r.stderr


@pytest.mark.parametrize("flags,status,says", [
    ("fpu sse avx avx2 avx512f", "ok", "avx512f"),
    ("fpu sse avx avx2", "warn", "slower than with AVX-512"),
    ("fpu sse avx", "warn", "~20x slower"),
])
def test_cpu_features_decide_the_cpu_check(flags, status, says):
    c = cpu_check(f"processor\t: 0\nflags\t\t: {flags}\n")
    assert c.status == status and says in c.detail
    assert c.status == "ok" or c.fix


def test_an_openai_teacher_is_probed():
    with FakeOpenAI("ok") as srv:
        ok = teacher_check(teacher_config({"backend": "openai", "endpoints": [srv.url], "model": "fake"}))
    assert ok.status == "ok"
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    bad = teacher_check(teacher_config({"backend": "openai", "endpoints": [dead], "model": "fake"}))
    assert bad.status == "fail" and dead in bad.detail and bad.fix


def test_a_missing_vllm_model_fails_the_teacher_check(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAJFORGE_CACHE", str(tmp_path))
    c = teacher_check(teacher_config({"backend": "vllm", "vllm": {"model": "embedded:nothing-here"}}))
    assert c.status == "fail" and "make teacher" in c.fix


def test_doctor_states_the_network_policy_per_phase():
    """build: `synthesize.build.egress` (allowlist needs root and iptables; host warns); agent and verifier: none."""
    from trajforge.schemas.config import parse_config

    def rows(egress: str, **kw) -> dict:
        cfg = parse_config({"dataset": "d", "synthesize": {"imports": ["x"], "build": {"egress": egress}},
                            "teacher": {"backend": "replay"}})
        return {c.name: c for c in network_checks(cfg, **kw)}

    ok = rows("allowlist", iptables="/usr/sbin/iptables", root=True)
    assert ok["network: build"].status == "ok" and "trajforge-build" in ok["network: build"].detail
    assert "deb.debian.org" in ok["network: build"].detail
    assert (ok["network: agent"].status, ok["network: verifier"].status) == ("ok", "ok")
    assert "none" in ok["network: agent"].detail and "none" in ok["network: verifier"].detail
    no_fw = rows("allowlist", iptables="", root=True)["network: build"]
    assert no_fw.status == "fail" and "egress: none" in no_fw.fix
    host = rows("host")["network: build"]
    assert host.status == "warn" and "loopback" in host.detail
    assert rows("none")["network: build"].detail.startswith("none")


def test_a_trajforge_process_prints_its_threads_stacks_on_sigusr1_and_runs_on():
    """What a build that seems stuck waits for: `kill -USR1 PID` (flows/runtime.py) prints every thread's stack
    to stderr, and the process goes on (tests/helpers.run_cli sends it to a CLI run past its timeout)."""
    import signal
    import subprocess
    import sys

    code = ("import threading, time, trajforge.flows.runtime\n"
            "threading.Thread(target=lambda: time.sleep(60), name='waiter', daemon=True).start()\n"
            "print('ready', flush=True)\n"
            "time.sleep(6)\n"
            "print('went on', flush=True)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGUSR1)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0 and "went on" in out, err
    assert err.lower().count("thread 0x") >= 2 and "line 2 in <lambda>" in err, err


def test_a_cli_run_past_its_timeout_fails_with_its_stacks_and_is_killed(tmp_path, monkeypatch):
    """tests/helpers.run_cli: a trajforge process still running at the timeout is asked for its threads' stacks
    (SIGUSR1), killed, and the test fails naming the timeout with those stacks (CI's cut-off runs said nothing
    of what a hung verify waited for)."""
    import stat
    import sys

    import helpers
    import pytest

    script = tmp_path / "trajforge"
    pid = tmp_path / "pid"
    script.write_text(f"#!{sys.executable}\nimport os, time\nimport trajforge.flows.runtime\n"
                      f"open({str(pid)!r}, 'w').write(str(os.getpid()))\ntime.sleep(120)\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(helpers, "venv_bin", lambda name: str(script))
    with pytest.raises(AssertionError, match=r"still ran after 3 s") as err:
        helpers.run_cli("verify", cwd=tmp_path, timeout=3)
    assert "line 5 in <module>" in str(err.value), str(err.value)  # the main thread's stack: at its sleep
    assert not Path(f"/proc/{pid.read_text()}").exists()  # killed and reaped
