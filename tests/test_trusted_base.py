"""The trusted base of judging (docs/verification.md): after an episode nothing inside its container
takes part in judging it. Processes: a root agent's container is restarted, so none survives whatever
its pid. Programs: what the episode changed of the system programs and libraries is read from outside
(the overlay upper folder on this host, or the engine's diff: both agree), and such an episode is never
judged by them."""

from __future__ import annotations

import os
import stat

import pytest

from trajforge.schemas.common import ChangeSet
from trajforge.schemas.config import SandboxConfig
from trajforge.tasks.sandbox import Sandbox
from trajforge.tasks.sandbox.layer import classify, judged, layer_entries, toolchain_changes, upper_changes
from trajforge.tasks.sandbox.walk import ChangeWalk

BASELINE = frozenset({"/usr", "/usr/bin", "/usr/bin/cat", "/usr/bin/ls", "/usr/sbin", "/usr/lib", "/usr/lib/x86_64-linux-gnu",
                      "/usr/lib/x86_64-linux-gnu/libc.so.6", "/usr/local", "/usr/local/bin", "/etc", "/bin", "/app"})
DIRS = frozenset({"/usr", "/usr/bin", "/usr/sbin", "/usr/lib", "/usr/lib/x86_64-linux-gnu", "/usr/local",
                  "/usr/local/bin", "/etc", "/app"})


@pytest.mark.parametrize("path,kind,expected", [
    ("/usr/bin/cat", "modified", True),                      # a shim in place of a program
    ("/usr/bin/ls", "deleted", True),
    ("/usr/lib/x86_64-linux-gnu/libevil.so", "added", True),  # a library the loader may pick
    ("/etc/ld.so.preload", "added", True),
    ("/usr/sbin/ls", "added", True),                          # shadows /usr/bin/ls on a PATH with sbin first
    ("/usr/bin/python", "added", False),                      # a new name: no harness program is called so
    ("/usr/local/bin/python3", "added", False),               # /usr/local: a change like any other (counterfactual)
    ("/app/solution.py", "added", False),
    ("/usr/lib/python3/dist-packages/geomlib/__init__.py", "added", False),  # a module: judged like /usr/local's
    ("/usr/lib/python3/dist-packages/zz.pth", "added", True),               # ...but a start-up hook is not
    ("/usr/lib/python3/dist-packages/_pytest/evil.py", "added", True),      # ...nor what the harness imports
    ("/usr/lib/python3/dist-packages/sitecustomize.py", "added", True),
    ("/usr", "replaced", True),                               # everything below made anew
    ("/bin", "modified", True),                               # the merged-usr link replaced
])
def test_what_counts_as_the_harness_toolchain(path, kind, expected):
    assert judged(path, kind, BASELINE) is expected


def test_an_overlay_upper_folder_is_read_without_running_anything(tmp_path):
    """Whiteouts (character device 0:0) are deletions, an opaque folder (`trusted.overlay.opaque=y`)
    replaced what the image had below it, folders merely copied up are no change by themselves, and
    links are never followed (a link to the host's / lists nothing of the host)."""
    upper = str(tmp_path)
    (tmp_path / "usr/bin").mkdir(parents=True)
    (tmp_path / "usr/bin/cat").write_text("#!/bin/sh\necho 1\n")
    os.mknod(tmp_path / "usr/bin/ls", stat.S_IFCHR | 0o600, os.makedev(0, 0))
    (tmp_path / "usr/lib/x86_64-linux-gnu").mkdir(parents=True)
    os.setxattr(tmp_path / "usr/lib/x86_64-linux-gnu", "trusted.overlay.opaque", b"y")
    (tmp_path / "usr/lib/x86_64-linux-gnu/libc.so.6").symlink_to("/")
    (tmp_path / "usr/local/bin").mkdir(parents=True)
    (tmp_path / "usr/local/bin/python3").write_text("shim")
    raw = upper_changes(upper)
    assert raw["/usr/bin/ls"] == "deleted" and raw["/usr/lib/x86_64-linux-gnu"] == "opaque"
    assert not any(p.startswith("/usr/local") for p in raw)  # not a system folder
    kinds = classify(raw, BASELINE, DIRS)
    assert kinds == {"/usr/bin/cat": "modified", "/usr/bin/ls": "deleted", "/usr/lib/x86_64-linux-gnu": "replaced",
                     "/usr/lib/x86_64-linux-gnu/libc.so.6": "modified"}
    assert toolchain_changes(kinds, BASELINE) == sorted(kinds)
    assert toolchain_changes(kinds, BASELINE, expected=("/usr/lib/*",)) == ["/usr/bin/cat", "/usr/bin/ls"]


def test_what_a_writable_layer_holds_joins_the_walks_change_set(tmp_path):
    """Fail closed (docs/verification.md, 5.): whatever the container's writable layer holds is in the change set,
    whatever the walk inside it listed: a file named like the walk's own spool, a name that is not UTF-8 (spelled
    as the walk spells it), what an opaque folder no longer holds; only the engine's mount points stay out, and a
    name the engine's diff could not spell makes the set incomplete."""
    (tmp_path / "tmp").mkdir()
    (tmp_path / "tmp/.tf-out.q1w2e3").write_text("def mean(v): ...")
    (tmp_path / "app/new/deep").mkdir(parents=True)
    (tmp_path / "app/new/deep/f.py").write_text("x")
    (tmp_path / "app/empty").mkdir()
    os.mknod(tmp_path / "app/old.txt", stat.S_IFCHR | 0o600, os.makedev(0, 0))
    (tmp_path / "etc/apt").mkdir(parents=True)
    os.setxattr(tmp_path / "etc/apt", "trusted.overlay.opaque", b"y")
    (tmp_path / "etc/apt/new.list").write_text("deb x")
    (tmp_path / "usr/sbin").mkdir(parents=True)
    (tmp_path / "usr/sbin/docker-init").write_text("")
    os.close(os.open(os.fsencode(tmp_path / "app") + b"/\xff.pth", os.O_CREAT | os.O_WRONLY))
    raw = layer_entries(str(tmp_path))
    assert raw["/app/old.txt"] == "deleted" and raw["/etc/apt"] == "opaque" and raw["/app/\\xff.pth"] == "present"
    baseline = frozenset({"/app", "/app/old.txt", "/etc", "/etc/apt", "/etc/apt/sources.list", "/tmp", "/usr",
                          "/usr/sbin"})
    dirs = frozenset({"/app", "/etc", "/etc/apt", "/tmp", "/usr", "/usr/sbin"})
    walker = type("Walker", (), {"children": {"/etc/apt": {"/etc/apt/sources.list"}}})()
    walked = ChangeSet(added=["/app/new/deep/f.py"], modified=[], deleted=[], total=1)
    joined = ChangeWalk.with_layer(walker, walked, classify(raw, baseline, dirs), 100)
    assert joined.added == ["/app/\\xff.pth", "/app/empty", "/app/new/deep/f.py", "/etc/apt/new.list",
                            "/tmp/.tf-out.q1w2e3"]
    assert joined.deleted == ["/app/old.txt", "/etc/apt/sources.list"] and not joined.truncated
    assert joined.total == 7
    # the engine's diff (no host view) spells a byte that is not UTF-8 as U+FFFD: no revert could address it
    engine = ChangeWalk.with_layer(walker, walked, {"/app/\ufffd.pth": "added"}, 100)
    assert engine.truncated
    assert ChangeWalk.with_layer(walker, walked, {}, 100) is walked


@pytest.mark.docker
def test_toolchain_changes_read_from_the_host_agree_with_the_engines_diff(docker_client):
    """Both outside views of a root agent's changes give the same verdict: the shims and the planted
    library count, a new program name, /usr/local and the work dir do not."""
    with Sandbox(docker_client, "trajforge/base:latest", SandboxConfig(), agent="root", workdir="/app") as sb:
        res = sb.exec("mkdir -p /app && cp /usr/bin/tac /usr/bin/cat && rm /usr/bin/tr && "
                      ": > /usr/lib/x86_64-linux-gnu/libevil.so && cp /usr/bin/true /usr/sbin/ls && "
                      "cp /usr/bin/true /usr/bin/python && mkdir -p /usr/local/bin && : > /usr/local/bin/python3 && "
                      ": > /app/out.txt", 30)
        assert res.exit_code == 0, res.output
        host = sb.toolchain()
        assert sb._upper_dir() is not None  # this host reads the layer itself
        sb._upper_dir = lambda: None  # the other provider: the engine's diff
        engine = sb.toolchain()
    assert host == engine == ["/usr/bin/cat", "/usr/bin/tr", "/usr/lib/x86_64-linux-gnu/libevil.so", "/usr/sbin/ls"]


@pytest.mark.docker
def test_no_process_of_a_root_agents_episode_survives_settle_whatever_its_pid(docker_client):
    """The init and its `sleep infinity` are spared by pid number by a kill inside the container: a root
    agent could have taken one over. After `settle` every process that ran during the episode is gone
    (each process is identified by its pid and its start time), and a plant in /dev is gone with it."""
    probe = "for d in /proc/[0-9]*; do echo \"${d#/proc/} $(cut -d' ' -f22 $d/stat)\"; done"
    with Sandbox(docker_client, "trajforge/base:latest", SandboxConfig(), agent="root", workdir="/app") as sb:
        sb.exec("mkdir -p /app; (setsid sleep 600 &) ; rm -f /dev/fd && mkdir /dev/fd && : > /dev/fd/63", 30)
        before = set(sb.exec(probe, 30, user="root").output.split("\n"))
        leftover, _, changes = sb.settle([])
        after = set(sb.exec(probe, 30, user="root").output.split("\n"))
        dev_fd = sb.exec("readlink /dev/fd", 10, user="root").output.strip()
    assert leftover >= 1 and sb.restarted
    survivors = {line for line in before & after if line.strip() and not line.startswith(("1 ",))}
    assert not survivors, survivors  # (the exec shells differ anyway; the init and the sleep must too)
    assert any(line.startswith("1 ") for line in before) and not ({x for x in before if x.startswith("1 ")} & after)
    assert dev_fd == "/proc/self/fd"
    assert not [p for p in changes.paths() if p.startswith("/dev")]


@pytest.mark.docker
def test_a_planted_file_name_cannot_add_or_move_files_in_the_captured_state(docker_client):
    """The files changed outside the work dir travel as a tar made from a list of their names: names
    holding newlines, a leading dash, a `-C` line or bytes that are not UTF-8 are carried as they are,
    and add nothing else (a newline-separated list read `-C /etc` as an option and took all of /etc)."""
    import io
    import tarfile

    evil = "/opt/x/a\n-C\netc"  # (one name: as list lines, `-C etc` moves tar into /etc)
    odd = "/opt/x/\\xff-name"  # the walk's spelling of a byte that is not UTF-8
    with Sandbox(docker_client, "trajforge/base:latest", SandboxConfig(), agent="root", workdir="/app") as sb:
        res = sb.exec("mkdir -p /app /opt/x && echo mine > $'/opt/x/a\\n-C\\netc' && echo dash > /opt/x/--help && "
                      "echo odd > $'/opt/x/\\xff-name' && echo plain > /opt/x/b", 30)
        assert res.exit_code == 0, res.output
        data = sb.archive_paths([evil, "/opt/x/--help", odd, "/opt/x/b"], 1 << 20)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        got = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    assert got == {evil.lstrip("/"): b"mine\n", "opt/x/--help": b"dash\n", "opt/x/\udcff-name": b"odd\n",
                   "opt/x/b": b"plain\n"}, sorted(got)


@pytest.mark.docker
def test_tests_the_episode_broke_are_its_failure_not_a_reject(tmp_path):
    """The hidden tests hung on the episode's final state (a FIFO where they read its output): the row
    stays in the dataset as a verified failure with the cause named (`tests_unrunnable`, and the FIFO
    itself `output_kind`), never a `verifier_error` reject that drops an honest failure."""
    import io
    import tarfile
    from pathlib import Path

    from trajforge.schemas.common import ChangeSet
    from trajforge.schemas.config import parse_config
    from trajforge.schemas.trajectory import InPlaceTests, Rollout, Step
    from trajforge.tasks.agent.harness import HARNESS
    from trajforge.tasks.engine import StageContext
    from trajforge.tasks.envs.formats import import_task
    from trajforge.tasks.verify import verify_rollouts

    env = import_task(Path(__file__).parent / "fixtures" / "integrity" / "harbor" / "run-script")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, kind in (("app", tarfile.DIRTYPE), ("app/total.txt", tarfile.FIFOTYPE)):
            info = tarfile.TarInfo(name)
            info.type = kind
            tar.addfile(info)
    r = Rollout(rollout_id="r1", env_id=env.env_id, teacher="t", harness=HARNESS, sample=0, messages=[], status="ok",
                steps=[Step(turn=1, command="mkfifo /app/total.txt", exit_code=0, duration_s=0.1)],
                final_state=buf.getvalue(), changes=ChangeSet(added=["/app/total.txt"], total=1),
                in_place_tests=InPlaceTests(error="test run timed out after 60s", output="..."))
    cfg = parse_config({"dataset": "t", "runs": str(tmp_path), "synthesize": {"families": [{"name": "log_report"}]},
                        "teacher": {"backend": "replay"}, "verify": {"replay_on_sibling": False}})
    out = verify_rollouts(StageContext.create(cfg, "b"), {env.env_id: env}, [r])
    assert not out.rejects, out.rejects
    (v,) = out.rows
    assert v.verified and not v.passed and not v.tests_passed and v.reward == 0.0 and v.mode == "in_place"
    assert {"tests_unrunnable", "output_kind"} <= set(v.hack_flags), v.hack_flags
    flag = next(h for h in v.hacks if h.kind == "tests_unrunnable")
    assert "timed out" in flag.detail and flag.command == "mkfifo /app/total.txt"


@pytest.mark.docker
@pytest.mark.parametrize("venue", ["fresh", "in_place"])
@pytest.mark.parametrize("blind", ["rm -rf /tmp", "rm -rf /tmp && touch /tmp", "rm -rf /tmp && ln -s /dev/null /tmp"])
def test_an_episode_that_removes_or_replaces_tmp_does_not_blind_the_change_walk(docker_client, blind, venue):
    """Red team (issue 41, round 1): the change walk spooled its folder list in /tmp, so an episode that removed or
    replaced /tmp got an empty change set reported complete, and the counterfactual that catches a planted
    conftest.py never ran. The walk now spools elsewhere when /tmp is unusable and ends with a record a complete
    change set must carry: it sees the planted file in both venues' settle."""
    with Sandbox(docker_client, "trajforge/base:latest", SandboxConfig(), agent="root", workdir="/app") as sb:
        sb.fresh = venue == "fresh"
        sb.exec(f"mkdir -p /app && echo 42 > /app/answer.txt && echo 'x = 1' > /conftest.py && {blind}", 30)
        _, _, changes = sb.settle([])
    assert not changes.truncated, changes
    assert {"/app/answer.txt", "/conftest.py", "/tmp"} <= set(changes.paths()), changes


def test_a_change_walk_that_did_not_run_to_its_end_is_incomplete_never_empty():
    """Without the walk's closing record the change set is incomplete (`truncated`: a pass is never decided on it),
    whatever rows came before it."""
    from trajforge.tasks.sandbox.walk import ChangeWalk

    walk = ChangeWalk.__new__(ChangeWalk)
    walk.baseline, walk.children, walk.cfg = frozenset({"/", "/app"}), {"/": {"/app"}}, SandboxConfig()
    walk.workdir = "/app"
    assert walk._change_set([], 100).truncated
    assert not walk._change_set([("Z", "-", "walked")], 100).truncated
