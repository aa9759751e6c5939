"""The sandbox defaults, attacked for real in Docker."""

import os
import socket

import pytest

from trajforge.tasks.sandbox import LABEL, Sandbox, reap_orphans

pytestmark = pytest.mark.docker


@pytest.fixture
def sb(docker_client, sandbox_cfg):
    with Sandbox(docker_client, sandbox_cfg.base_image, sandbox_cfg) as s:
        yield s


def test_agent_is_unprivileged_and_offline(sb):
    assert sb.exec("id -u", 10).output.strip() == "1000"
    assert sb.exec("grep CapEff /proc/self/status", 10).output.split()[-1] == "0000000000000000"
    assert sb.exec("grep CapEff /proc/self/status", 10, user="root").output.split()[-1] == "0000000000000000"
    assert sb.exec("grep NoNewPrivs /proc/self/status", 10).output.split()[-1] == "1"
    out = sb.exec("cat /proc/net/dev | tail -n +3 | cut -d: -f1", 10).output.split()
    assert out == ["lo"], out
    assert sb.exec("test -S /var/run/docker.sock", 10).exit_code != 0
    r = sb.exec("python3 -c \"import socket; socket.create_connection(('1.1.1.1', 53), timeout=2)\"", 10)
    assert r.exit_code != 0 and "unreachable" in r.output.lower()


def test_in_place_verification_container_gives_the_agent_nothing(docker_client, sandbox_cfg):
    """Episodes verified in place keep SETUID/SETGID in the bounding set (the root-run hidden tests
    drop to the agent user with them); agent processes still have no capability and cannot gain one."""
    from trajforge.tasks.sandbox.verifier import VERIFIER_CAPS

    with Sandbox(docker_client, sandbox_cfg.base_image, sandbox_cfg, cap_add=VERIFIER_CAPS) as s:
        for field in ("CapEff", "CapPrm", "CapAmb"):
            assert s.exec(f"grep {field} /proc/self/status", 10).output.split()[-1] == "0000000000000000", field
        assert s.exec("grep NoNewPrivs /proc/self/status", 10).output.split()[-1] == "1"
        assert s.exec("python3 -c 'import os; os.setuid(0)'", 10).exit_code != 0
        assert int(s.exec("grep CapEff /proc/self/status", 10, user="root").output.split()[-1], 16) == 0xC0


def test_command_timeout_kills_the_process_group(sb):
    r = sb.exec("sleep 100 & sleep 100; echo never", 1.5)
    assert r.timed_out and r.exit_code == 137 and "never" not in r.output
    assert sb.exec("pgrep -c -u agent -x sleep || true", 5).output.strip() == "0"


def test_output_is_truncated_head_and_tail(sb):
    r = sb.exec("seq 1 100000", 10, output_limit=1000)
    assert r.truncated and r.output_bytes > 100000 // 2
    assert r.output.startswith("1\n2\n") and r.output.rstrip().endswith("100000") and "truncated" in r.output
    assert len(r.output) < 1200


def test_exit_code_and_workdir(sb):
    r = sb.exec("pwd; exit 3", 5)
    assert r.exit_code == 3 and r.output.strip() == "/home/agent/work" and not r.timed_out


def test_orphans_of_dead_owner_are_reaped(docker_client, sandbox_cfg):
    dead = os.fork()
    if dead == 0:
        os._exit(0)
    os.waitpid(dead, 0)
    orphan = Sandbox(docker_client, sandbox_cfg.base_image, sandbox_cfg)
    orphan.labels["trajforge.owner"] = f"{socket.gethostname()}:{dead}"
    orphan.start()
    mine = Sandbox(docker_client, sandbox_cfg.base_image, sandbox_cfg)
    mine.start()
    try:
        assert reap_orphans(docker_client) >= 1
        names = {c.name for c in docker_client.containers.list(all=True, filters={"label": LABEL})}
        assert orphan.name not in names and mine.name in names
    finally:
        mine.close()
        orphan.close()


def test_fork_bomb_is_contained_by_the_pids_limit(sb, sandbox_cfg):
    r = sb.exec(":(){ :|:& };:; sleep 4", 5)  # (the bomb backgrounds itself: the shell waits, reading its output)
    assert "fork" in r.output.lower()  # the bomb ran out of pids
    peak = sb.container.stats(stream=False)["pids_stats"]["current"]
    assert peak <= sandbox_cfg.pids_limit
    sb.kill_agent_processes()  # what happens before verification, and at the end of every episode
    assert sb.exec("echo alive", 10).output.strip() == "alive"
    assert sb.exec("ps -e -o user= | grep -c agent || true", 10, user="root").output.strip() == "0"


def test_memory_hog_is_oom_killed_and_the_sandbox_goes_on(docker_client, sandbox_cfg):
    cfg = sandbox_cfg.model_copy(update={"memory_mb": 96})
    with Sandbox(docker_client, cfg.base_image, cfg) as s:
        r = s.exec("python3 -c 'x = bytearray(400 * 2**20); print(len(x))'", 20)
        assert r.exit_code == 137 and r.killed_by == "oom" and not r.timed_out
        assert s.exec("echo still here", 10).output.strip() == "still here"


def test_infinite_loop_hits_the_command_timeout(sb):
    r = sb.exec("while true; do :; done", 1)
    assert r.timed_out and r.killed_by == "timeout" and 1 <= r.duration_s < 5


def test_background_processes_die_before_verification(sb):
    sb.exec("nohup sleep 1000 >/dev/null 2>&1 & setsid sleep 1000 >/dev/null 2>&1 &", 5)
    assert int(sb.exec("pgrep -c -u agent sleep", 5, user="root").output.strip()) == 2
    sb.kill_agent_processes()
    assert sb.exec("pgrep -c -u agent sleep || true", 5, user="root").output.strip() == "0"


def test_reaping_survives_containers_vanishing_while_it_lists(docker_client, sandbox_cfg, monkeypatch):
    """Another build removing its sandboxes while this one reaps must not fail the reaper (a full
    listing inspects each container and raised NotFound for one removed in between)."""
    import docker.errors

    from trajforge.tasks.sandbox import reaper

    calls = []
    real = docker_client.api.inspect_container

    def vanished(cid, *a, **kw):
        calls.append(cid)
        raise docker.errors.NotFound("No such container")

    with Sandbox(docker_client, "trajforge/base:latest", sandbox_cfg, labels={"trajforge.build": "vanish"}):
        monkeypatch.setattr(docker_client.api, "inspect_container", vanished)
        try:
            assert reaper.reap_orphans(docker_client, build_id="vanish") == 1
        finally:
            monkeypatch.setattr(docker_client.api, "inspect_container", real)
    assert calls == [], "the reaper must not inspect containers one by one"


@pytest.mark.parametrize("agent", ["agent", "root"])
def test_change_set_is_exact_in_every_container_of_an_image(docker_client, sandbox_cfg, agent):
    """Added, modified and deleted paths against the image, in the first container of an image and in
    later ones (each overlay has its own device), including a back-dated `touch -d` and `cp -p`."""
    home = "/home/agent/work"
    write = {"agent": f"echo a > {home}/new.txt && touch -d 2001-01-01 {home}/new.txt && cp -p /etc/passwd {home}/p",
             "root": "echo x > /conftest.py && echo y >> /etc/profile && rm /etc/issue && rm -rf /usr/share/doc/grep "
                     "&& mkdir -p /data/a && echo z > /data/a/c && touch -d 2001-01-01 /data/a/c"}[agent]
    want = {"agent": ([f"{home}/new.txt", f"{home}/p"], [], []),
            "root": (["/conftest.py", "/data/a/c"], ["/etc/profile"], ["/etc/issue", "/usr/share/doc/grep"])}[agent]
    for _ in range(2):  # the second container of the image reads the cached image listing
        with Sandbox(docker_client, "trajforge/base:latest", sandbox_cfg, agent=agent) as sb:
            assert sb.changes().total == 0
            assert sb.exec(write, 30).exit_code == 0
            ch = sb.changes()
            assert (ch.added, ch.modified, ch.deleted) == want and ch.total == sum(map(len, want))
