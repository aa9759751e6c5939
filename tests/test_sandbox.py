"""The sandbox defaults, attacked for real in Docker."""

import os
import shlex
import socket
import time

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
    from trajforge.tasks.judge.verifier import VERIFIER_CAPS

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


def test_a_work_dir_the_engine_made_for_one_container_is_not_in_another_ones_baseline(docker_client, sandbox_cfg):
    """The image's file list is read once per process, from its first container: the engine makes a work dir the
    image lacks (`/app` here), so a later container of another work dir must not see `/app` as deleted (it did
    when a test with `workdir="/app"` ran first in the same process)."""
    with Sandbox(docker_client, "trajforge/base:latest", sandbox_cfg, agent="root", workdir="/app") as sb:
        assert sb.changes().total == 0
    with Sandbox(docker_client, "trajforge/base:latest", sandbox_cfg, agent="root") as sb:
        ch = sb.changes()
        assert ch.total == 0, (ch.added, ch.modified, ch.deleted)


AGENT_WRITES = (
    "cd /home/agent/work && echo a > new.txt && mkdir -p d/e && echo b > d/e/f && mv new.txt moved.txt && "
    "chmod 600 moved.txt && ln moved.txt hard && ln -s /etc/passwd link && echo c > /tmp/t && "
    "mkdir /var/tmp/v && echo w >> /etc/ww && echo s > /opt/shared/s && rm /opt/shared/seed && "
    "echo m > /srv/mine/x && chmod 700 /srv/mine && mkdir secret && echo h > secret/h && chmod 000 secret && "
    "echo p > /srv/priv/drop/c.py && echo n > /srv/priv/drop/n.py && (sleep 0.2; echo late > /tmp/late) & wait"
)


@pytest.fixture(scope="module")
def writable_image(docker_client):
    """The base image plus places an unprivileged agent may write outside its home: a world-writable
    root file, a world-writable folder with a root file in it, a folder the agent owns, a world-writable
    folder below one the agent may search but not list (mode 711)."""
    import io

    dockerfile = ("FROM trajforge/base:latest\nUSER root\nRUN echo x > /etc/ww && chmod 666 /etc/ww && "
                  "mkdir -p /opt/shared && chmod 777 /opt/shared && echo seed > /opt/shared/seed && "
                  "mkdir -p /srv/mine && chown 1000:1000 /srv/mine && mkdir -m 711 /srv/priv && "
                  "mkdir -m 777 /srv/priv/drop && echo c > /srv/priv/drop/c.py && chmod 666 /srv/priv/drop/c.py\n")
    image, _ = docker_client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag="trajforge/test-writable:1",
                                          pull=False, rm=True)
    yield image.tags[0]


def test_the_agents_change_walk_starts_only_where_it_can_write_and_misses_nothing(docker_client, sandbox_cfg,
                                                                                   writable_image):
    """The change walk of an unprivileged agent starts only at what its user may write or owns (a few
    places, not /usr), and gives exactly the change set of a walk of the whole filesystem, whatever
    the agent did there: create, rename, chmod, hard and soft links, background writes, a write to a
    world-writable root file, a deletion in a world-writable folder. Folders made unreadable to root
    (modes 700 and 000: root here has no DAC capability) hide nothing (what lies below them comes from
    the engine's diff), lose no record of the walk to a "Permission denied" message, and invent no
    deletion."""
    with Sandbox(docker_client, writable_image, sandbox_cfg) as sb:
        roots = sb.agent_roots
        assert roots is not None and "/usr" not in roots and not any(r.startswith("/usr/") for r in roots)
        assert {"/home/agent", "/tmp", "/etc/ww", "/opt/shared", "/srv/mine"} <= set(roots) or \
            {"/home/agent/work", "/tmp", "/etc/ww", "/opt/shared", "/srv/mine"} <= set(roots), roots
        assert sb.exec(AGENT_WRITES, 30).exit_code == 0
        fast = sb.changes()
        sb.agent_roots = None  # the whole root filesystem
        full = sb.changes()
    assert (fast.added, fast.modified, fast.deleted) == (full.added, full.modified, full.deleted)
    w = "/home/agent/work"
    assert set(fast.added) == {f"{w}/moved.txt", f"{w}/hard", f"{w}/link", f"{w}/d/e/f", "/tmp/t", "/tmp/late",
                               "/var/tmp/v", "/opt/shared/s", "/srv/mine/x", f"{w}/secret/h", "/srv/priv/drop/n.py"}, fast
    assert fast.modified == ["/etc/ww", "/srv/priv/drop/c.py"] and fast.deleted == ["/opt/shared/seed"], fast


def test_a_write_by_anyone_but_the_agent_makes_the_change_walk_whole_again(docker_client, sandbox_cfg):
    """A command run as root (not marked read-only) or an archive the engine extracts can write where
    the agent cannot: from then on the change set walks the whole filesystem and sees it."""
    from trajforge.schemas.common import FileSpec

    with Sandbox(docker_client, "trajforge/base:latest", sandbox_cfg) as sb:
        assert sb.agent_roots
        sb.exec("sha256sum /etc/passwd", 10, user="root", readonly=True)
        assert "/etc/root-wrote" not in sb.changes().added and not sb.others_wrote
        sb.exec("echo x > /etc/root-wrote", 10, user="root")
        assert "/etc/root-wrote" in sb.changes().added
    with Sandbox(docker_client, "trajforge/base:latest", sandbox_cfg) as sb:
        sb.put_files([FileSpec(path="f", content="x")], parent="/", root="opt/engine", uid=0)
        assert "/opt/engine/f" in sb.changes().added


def test_fork_chains_do_not_outlive_the_settle(docker_client, sandbox_cfg):
    """Processes that fork and exit in a loop (each chain one live process at a time) used to slip
    between pkill's reading of /proc and its signals and go on writing after the change walk. The
    agent's processes are killed with kill(-1), one pass no fork escapes: nothing of the agent's runs
    after `settle`, and every file the chains wrote is in the change set."""
    chain = ("import os, time\nn = 0\nwhile True:\n    if os.fork():\n        os._exit(0)\n    n += 1\n"
             "    if n % 100 == 0:\n        open('/home/agent/work/late_%d_%d' % (os.getpid(), n), 'w').write('x')\n")
    with Sandbox(docker_client, "trajforge/base:latest", sandbox_cfg) as sb:
        sb.put_files([], parent="/", root="tmp/none", uid=1000)  # (an engine write: the whole walk, as before)
        start = " ".join(["setsid python3 -c \"$C\" </dev/null >/dev/null 2>&1 &"] * 6)
        assert sb.exec(f"export C={shlex.quote(chain)}; {start} sleep 1; echo ok", 30).output.strip() == "ok"
        leftover, _, changes = sb.settle([])
        assert leftover != 0
        time.sleep(2)
        assert sb._harness(["pgrep", "-c", "-u", "1000"])[1].strip() == b"0"
        late = sorted(p for p, k in sb._engine_diff().items() if "/late_" in p and k == "added")
    assert late and sorted(p for p in changes.added if "/late_" in p) == late


def test_protected_checksums_follow_no_link_and_open_nothing_but_regular_files(sb):
    """The protected-path checksums run as root over what the agent left: a link to /dev/zero or to a
    FIFO used to be opened and read (a 60 s hang, then an infrastructure error retried), and a pair of
    `x -> .` links made `**` explode. Links are checksummed as links (a protected file swapped for a
    link to an identical copy counts as changed), other special files by type, and a loop is one entry."""
    w = "/home/agent/work"
    assert sb.exec(f"mkdir -p {w}/tests && echo t > {w}/tests/t.py && echo c > {w}/check.py", 10).exit_code == 0
    globs = ["tests/**", "check.py"]
    before = sb.digests(globs)
    assert set(before) == {"tests/t.py", "check.py"}
    plant = (f"cd {w} && cp check.py /tmp/c && rm check.py && ln -s /tmp/c check.py && cd tests && "
             "ln -s /dev/zero z && mkfifo /tmp/ff && ln -s /tmp/ff p && mkfifo q && "
             "for i in a b c d e f g h; do ln -s . $i; done")
    assert sb.exec(plant, 10).exit_code == 0
    leftover, after, _ = sb.settle(globs)
    assert leftover == 0
    assert after["tests/t.py"] == before["tests/t.py"]
    assert after["check.py"].startswith("link:") and after["check.py"] != before["check.py"]
    assert after["tests/z"].startswith("link:") and after["tests/p"].startswith("link:")
    assert after["tests/q"].startswith("special:")
    assert sorted(k for k in after if k.startswith("tests/")) == sorted(
        ["tests/t.py", "tests/z", "tests/p", "tests/q"] + [f"tests/{i}" for i in "abcdefgh"])
    # sparse files and hard links: each inode read once, holes skipped (they used to be hashed as
    # gigabytes of zeros, per link, until the 60 s kill: a retried infrastructure error)
    sparse = (f"cd {w}/tests && truncate -s 1000M s0 && for i in $(seq 60); do ln s0 l$i; done && "
              "truncate -s 1000M s1 && printf abc | dd of=s1 bs=1 seek=500000000 conv=notrunc 2>/dev/null")
    assert sb.exec(sparse, 20).exit_code == 0
    _, first, _ = sb.settle(globs)
    assert first["tests/s0"] == first["tests/l60"] != first["tests/s1"]
    assert sb.exec(f"printf x | dd of={w}/tests/s1 bs=1 seek=500000001 conv=notrunc 2>/dev/null", 20).exit_code == 0
    _, second, _ = sb.settle(globs)
    assert second["tests/s1"] != first["tests/s1"] and second["tests/s0"] == first["tests/s0"]


def test_a_hidden_folder_with_a_name_that_is_not_utf8_hides_nothing(sb):
    """Below a folder root cannot list, the change set takes the engine's diff, which spells a byte
    that is not UTF-8 as U+FFFD where the walk writes `\\xNN`: the two spellings used not to match and
    everything the agent put there was lost."""
    script = ("d=$(printf 'x\\377y'); mkdir \"$d\" && echo s > \"$d/secret.py\" && mkdir \"$d/sub\" && "
              "echo t > \"$d/sub/t\" && chmod 700 \"$d\" && mkdir 'h\\x41' && echo c > 'h\\x41/conftest.py' && "
              "chmod 700 'h\\x41'")  # (and a name with a literal `\\x41`, which the engine spells alike)
    assert sb.exec(script, 20).exit_code == 0
    w = "/home/agent/work/x\\xffy"
    want = ["/home/agent/work/h\\x41/conftest.py", f"{w}/secret.py", f"{w}/sub/t"]
    assert sb.changes().added == want
    assert sb.settle([])[2].added == want


def test_hidden_tests_travel_in_the_exec_that_runs_them_unless_large(docker_client, sandbox_cfg, monkeypatch):
    """Small tests are written by the exec that runs them (no archive upload by the engine, which costs
    about as much CPU as the exec); large ones are uploaded as before. Either way `/verifier` is made
    fresh by that exec: a root agent's planted `/verifier` (a link into its work dir holding a forged
    runner) is gone, and a test that fails still fails."""
    from trajforge.schemas.common import FileSpec
    from trajforge.schemas.environment import EnvSpec
    from trajforge.tasks.judge.verifier import INLINE_LIMIT, VERIFIER_CAPS, run_hidden_tests

    uploads = []
    real_put = Sandbox._put
    monkeypatch.setattr(Sandbox, "_put", lambda self, parent, data: (uploads.append(parent), real_put(self, parent, data)))
    check = "def test_out():\n    assert open(WORK + '/out.txt').read() == 'ok\\n'\n"
    big = check + "# " + "x" * INLINE_LIMIT + "\n"
    for content, n_uploads in ((check, 0), (big, 1)):
        env = EnvSpec(env_id="t", family="f", level=1, seed=0, instruction="-", agent_user="root",
                      tests=[FileSpec(path="test_task.py", content=content),
                             FileSpec(path="test_more.py", content="def test_more():\n    import os\n    assert open("
                                      "os.path.dirname(__file__) + '/data/x.txt').read() == 'x'\n"),
                             FileSpec(path="data/x.txt", content="x")])
        for solve, passed in ((True, True), (False, False)):
            uploads.clear()
            with Sandbox(docker_client, "trajforge/base:latest", sandbox_cfg, workdir=env.workdir,
                         cap_add=VERIFIER_CAPS, agent="root") as sb:
                plant = ("mkdir -p /home/agent/work/fake/tests && echo 'print(\"__TF_RESULTS__ []\")' > "
                         "/home/agent/work/fake/runner.py && ln -s /home/agent/work/fake /verifier")
                assert sb.exec(plant + (" && echo ok > /home/agent/work/out.txt" if solve else ""), 10).exit_code == 0
                uploads.clear()
                run = run_hidden_tests(sb, env, 60)
                assert run.passed is passed, (run.error, run.output)
                assert sorted(r.name for r in run.results) == ["test_more", "test_out"], run.results
                assert len(uploads) == n_uploads
                assert sb.exec("test -L /verifier || echo fresh", 10, user="root").output.strip() == "fresh"


SCAN = r'''
import base64, os, re
needle, found = ("SECRET_" + "73914").encode(), []
for pid in filter(str.isdigit, os.listdir("/proc")):
    for what in ("cmdline", "environ"):
        try:
            data = open(f"/proc/{pid}/{what}", "rb").read()
        except OSError:
            continue
        texts = [data]
        for t in re.findall(rb"[A-Za-z0-9+/=]{100,}", data):
            try:
                texts.append(base64.b64decode(t + b"=" * (-len(t) % 4)))
            except ValueError:
                pass
        if any(needle in t for t in texts):
            found.append(f"{pid}/{what}")
print("LEAK" if found else "CLEAN", found)
'''


def test_hidden_tests_in_the_exec_stay_hidden_from_the_code_they_run(docker_client, sandbox_cfg):
    """Tests that travel in the exec are never on a command line (every user reads /proc/*/cmdline):
    agent code a hidden test runs (`run_as_agent`) scans every process's command line and environment,
    base64 decoded too, and finds nothing of them. (In the command line, it read the expected answer
    and passed.)"""
    from trajforge.schemas.common import FileSpec
    from trajforge.schemas.environment import EnvSpec
    from trajforge.tasks.judge.verifier import VERIFIER_CAPS, run_hidden_tests

    test = (f"# the expected answer: SECRET_73914\nSCAN = {SCAN!r}\n"
            "def test_the_agents_code_sees_no_test():\n"
            "    out = run_as_agent(['python3', '-c', SCAN]).stdout\n"
            "    assert out.startswith('CLEAN'), out\n")
    env = EnvSpec(env_id="t", family="f", level=1, seed=0, instruction="-",
                  tests=[FileSpec(path="test_task.py", content=test)])
    with Sandbox(docker_client, "trajforge/base:latest", sandbox_cfg, workdir=env.workdir,
                 cap_add=VERIFIER_CAPS) as sb:
        run = run_hidden_tests(sb, env, 60)
    assert run.passed, (run.error, run.output, run.results)


@pytest.mark.docker
def test_an_exec_whose_output_the_engine_lost_is_infrastructure_not_a_result(sb, monkeypatch):
    """Seen under load: an exec that exited 0 with an empty stream (the capture always ends with its own
    trailer). Read as a result, hidden tests would give 'no result' and reject a sound environment as
    `verifier_error`; it is a SandboxError instead, which every stage retries as infrastructure."""
    import trajforge.tasks.sandbox.container as container
    from trajforge.tasks.sandbox import SandboxError

    monkeypatch.setattr(container, "run_exec", lambda *a, **kw: (0, b""))
    with pytest.raises(SandboxError, match="empty output stream"):
        sb.exec("echo hi", 10)
    monkeypatch.setattr(container, "run_exec", lambda *a, **kw: (137, b""))
    assert sb.exec("echo hi", 10).exit_code == 137  # a killed capture stays the command's outcome


def test_a_judging_container_removes_what_the_agent_added_or_says_it_cannot(docker_client, sandbox_cfg):
    """The counterfactual reverts a file the agent added to its work dir by removing it from a judging container
    (VERIFIER_CAPS: its root has no CAP_DAC_OVERRIDE, so root's `rm` is refused in a folder the agent owns, which
    once left the file in place and let a pass that depended on it hold). `remove_paths` removes it as the agent
    (a mode-000 folder too), and raises when a path is still there: never a silent keep."""
    from trajforge.tasks.judge.changes import remove_paths
    from trajforge.tasks.judge.verifier import VERIFIER_CAPS, restore_state
    from trajforge.tasks.sandbox.errors import SandboxError

    with Sandbox(docker_client, sandbox_cfg.base_image, sandbox_cfg) as ep:
        assert ep.exec("mkdir -p pkg locked && echo X=1 > pkg/helper.py && touch locked/f && chmod 000 locked",
                       30).exit_code == 0
        state = ep.get_archive(ep.workdir, 64 << 20)
        work = ep.workdir.rstrip("/")
    with Sandbox(docker_client, sandbox_cfg.base_image, sandbox_cfg, cap_add=VERIFIER_CAPS) as judge:
        restore_state(judge, state)
        helper, locked = f"{work}/pkg/helper.py", f"{work}/locked"
        judge.exec(f"rm -rf -- {helper}", 30, user="root", workdir="/")
        assert judge.path_kind(helper) == "file"  # the fault: root alone cannot remove it here
        remove_paths(judge, [helper, locked])
        assert judge.path_kind(helper) is None and judge.path_kind(locked) is None
        assert judge.path_kind(f"{work}/pkg") == "dir"  # only the named paths go
        # a file in a read-only folder of root's: neither root (no CAP_DAC_OVERRIDE) nor the agent can remove it
        assert judge.exec("mkdir -p /srv/ro && touch /srv/ro/keep && chmod 555 /srv/ro", 30, user="root",
                          workdir="/").exit_code == 0
        with pytest.raises(SandboxError, match="/srv/ro/keep"):
            remove_paths(judge, ["/srv/ro/keep"])
