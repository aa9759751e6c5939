"""Bounded resources per sandbox and per build container, and execs that never hang (real Docker)."""

import re

import pytest

from trajforge.schemas.common import FileSpec
from trajforge.schemas.environment import EnvSpec
from trajforge.tasks.sandbox import Sandbox
from trajforge.tasks.sandbox.limits import storage_cap

pytestmark = pytest.mark.docker


@pytest.fixture
def small(docker_client, sandbox_cfg):
    """A sandbox with small caps: 16 MiB files, 64 open files, a 3 s exec grace."""
    cfg = sandbox_cfg.model_copy(update={"file_size_mb": 16, "open_files": 64, "exec_grace_s": 3})
    with Sandbox(docker_client, cfg.base_image, cfg) as s:
        yield s


def _writable_bytes(sb) -> int:
    api = sb.client.api
    return api._result(api._get(api._url("/containers/{0}/json", sb.name), params={"size": 1}), True).get("SizeRw") or 0


def test_huge_output_is_kept_head_and_tail_and_never_spooled(small):
    before = _writable_bytes(small)
    r = small.exec("timeout 3 yes; echo THE-END", 20, output_limit=1000)
    assert r.output_bytes > 20 << 20, r.output_bytes  # `yes` wrote tens of MiB (GiBs on a fast machine)
    assert r.truncated and not r.timed_out and r.exit_code == 0
    assert r.output.startswith("y\ny\n") and r.output.rstrip().endswith("THE-END") and "bytes truncated" in r.output
    assert len(r.output) < 1100
    # nothing of it reached the container's disk: no spool file, the writable layer barely grew
    assert small.exec(f"find / -xdev -type f -size +1M -newerct @{small.started_at:.3f} 2>/dev/null || true", 30,
                      user="root").output.strip() == ""
    assert _writable_bytes(small) - before < 1 << 20


def test_short_output_is_whole_and_exit_code_kept(small):
    r = small.exec("printf 'a\\0b'; echo err >&2; exit 7", 10)
    assert r.exit_code == 7 and r.output == "a\x00berr\n" and r.output_bytes == 7 and not r.truncated


def test_write_beyond_the_file_size_cap_fails(small):
    r = small.exec("head -c 20M /dev/zero > big; echo rc=$?; stat -c %s big", 20)
    assert "rc=153" in r.output  # 128 + SIGXFSZ
    assert r.output.split()[-1] == str(16 << 20)
    r = small.exec("head -c 20M /dev/zero > /tmp/big", 20, user="root")  # the limit holds for root too
    assert r.exit_code != 0


def test_too_many_open_files_fail(small):
    r = small.exec("python3 -c \"fs = [open('/dev/null') for _ in range(200)]\"", 20)
    assert r.exit_code != 0 and "Too many open files" in r.output


def test_ulimits_and_storage_cap_are_set_on_the_container(small):
    host = small.client.api.inspect_container(small.name)["HostConfig"]
    limits = {u["Name"]: u["Hard"] for u in host["Ulimits"]}
    assert limits == {"fsize": 16 << 20, "nofile": 64}
    cap = storage_cap(small.client)
    assert cap in (True, False)  # learnt from this sandbox's create
    assert bool((host.get("StorageOpt") or {}).get("size")) == cap


def test_background_job_holding_the_pipe_does_not_hang_the_exec(small):
    r = small.exec("echo started; sleep 1000 & yes > /proc/self/fd/1 & "
                   "setsid nohup sleep 1000 > /proc/self/fd/1 2>&1 &", 20)
    assert r.output.strip().startswith("started") and not r.timed_out and r.exit_code == 0
    # background jobs keep running (a server started with `&` must survive its command)
    assert int(small.exec("pgrep -c -u 1000 -x sleep", 10, user="root").output.strip()) == 2
    assert small.exec("echo next", 10).output.strip() == "next"


def test_the_exec_output_itself_is_out_of_the_agents_reach(small):
    """The capture is non-dumpable: a detached process cannot take the exec's own output via /proc."""
    r = small.exec("setsid nohup sleep 1000 > /proc/$PPID/fd/1 2>&1 & sleep 0.5; echo done", 20)
    assert "done" in r.output and not r.timed_out
    assert small.exec("echo next", 10).output.strip() == "next"


def test_a_stream_held_past_the_deadline_ends_as_a_timeout(small):
    """A capture stopped by the agent (it may signal its own processes) leaves the exec's stream open:
    the client gives up after timeout + grace, kills the agent's processes, and the sandbox goes on."""
    r = small.exec("sleep 1000 & kill -STOP $PPID; sleep 1000", 1)
    assert r.timed_out and r.exit_code == 137 and "stayed open" in r.output
    assert small.exec("pgrep -c -u 1000 || true", 10, user="root").output.strip() == "0"
    assert small.exec("echo alive", 10).output.strip() == "alive"


def test_image_build_steps_are_limited(docker_client, sandbox_cfg):
    cfg = sandbox_cfg.model_copy(update={"build_memory_mb": 300, "build_cpus": 0.5, "open_files": 333})
    from trajforge.tasks.envs.images import ensure_image

    probe = ("cat /sys/fs/cgroup/memory.max /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null > limits || :; "
             "cat /sys/fs/cgroup/cpu.max /sys/fs/cgroup/cpu/cpu.cfs_quota_us 2>/dev/null >> limits || :; "
             "ulimit -n >> limits; ulimit -f >> limits")
    env = EnvSpec(env_id="limits-probe", family="t", level=1, seed=0, instruction="x",
                  files=[FileSpec(path="a.txt", content="limits test marker 7f3e\n")], setup=[probe],
                  tests=[FileSpec(path="test_x.py", content="def test_x():\n    pass\n")], solution=["true"])
    tag, _ = ensure_image(docker_client, cfg.base_image, env, limits=cfg)
    try:
        with Sandbox(docker_client, tag, cfg) as s:
            lines = s.exec("cat limits", 10).output.split()
        assert lines[0] == str(300 << 20)
        assert lines[1] == "50000"  # the CFS quota (v2: "50000 100000")
        assert lines[-2] == "333" and int(lines[-1]) * 1024 == cfg.file_size_mb << 20
    finally:
        docker_client.images.remove(tag, force=True)


def test_image_build_steps_have_a_pids_cap_where_the_engine_allows_one(docker_client, sandbox_cfg):
    """The legacy builder has no pids option: build steps run under a cgroup parent whose pids.max
    caps them (local engine, cgroupfs driver, root). A step forking past the cap fails the build."""
    from trajforge.tasks.envs.images import ImageBuildError, ensure_image
    from trajforge.tasks.sandbox.limits import BUILD_PIDS_FACTOR, build_cgroup

    cfg = sandbox_cfg.model_copy(update={"pids_limit": 16})
    parent = build_cgroup(docker_client, cfg)
    if parent is None:
        pytest.skip("this engine's cgroups cannot be written from here (remote engine, systemd driver, not root)")
    cap = BUILD_PIDS_FACTOR * 16
    fork = f"for i in $(seq {2 * cap}); do sleep 30 & done; wait"
    env = EnvSpec(env_id="pids-probe", family="t", level=1, seed=0, instruction="x",
                  files=[FileSpec(path="a.txt", content="pids test marker 51c2\n")], setup=[fork],
                  tests=[FileSpec(path="test_x.py", content="def test_x():\n    pass\n")], solution=["true"])
    with pytest.raises(ImageBuildError) as err:
        ensure_image(docker_client, cfg.base_image, env, limits=cfg)
    assert re.search(r"fork|Resource temporarily unavailable", str(err.value), re.I), str(err.value)[-500:]


@pytest.mark.slow
def test_a_shard_past_its_timeout_fails_the_stage_named(make_config, prefect_api):
    """The Prefect task timeout is the shards' backstop: the stage fails naming the shard and the limit,
    nothing is committed, and the build record says which stage failed."""
    from trajforge.flows.launch import run_build
    from trajforge.tasks.engine.store import RunStore

    # worker processes: the abandoned shards go on in the worker, which closes with the cluster (as threads they
    # would go on inside pytest)
    cfg = make_config(**{"dask.shard_timeout_s": 0.5, "synthesize.envs_per_shard": 1, "dask.processes": True})
    with pytest.raises(RuntimeError, match=r"shard part-\d+ of stage \w+ still running after dask.shard_timeout_s=0.5s") as err:
        run_build(cfg)
    stage = re.search(r"of stage (\w+) still running", str(err.value)).group(1)
    store = RunStore(cfg.runs, cfg.dataset)
    rec = store.read_build(store.builds()[-1])
    # (a stage quicker than the limit, such as propose, may commit before)
    assert rec.status == "failed" and rec.stages[stage].status != "committed"
    assert not any(e.status == "committed" for name, e in rec.stages.items() if name not in ("propose", stage))
    # the abandoned shards were fenced: recorded under the run's lease token, and none of them
    # committed a marker after that (the lease is released now too: a late one is refused either way)
    from trajforge.tasks.engine.lease import ABANDONED

    folder = store.stage_dir(rec.build_id, stage, rec.stages[stage].fingerprint)
    named = set(re.findall(r"shard (part-\d+) of stage", str(err.value)))
    records = {p.rsplit("/", 1)[-1].removesuffix(".json"): store.read_json(p)
               for p in store.fs.glob(f"{folder}/{ABANDONED}/*.json")}
    assert named <= set(records) and all(r["token"] for r in records.values())
    for shard, r in records.items():
        marker = f"{folder}/_done/{shard}"
        assert not store.exists(marker) or store.read_json(marker)["finished_at"] < r["at"], shard
    assert not store.exists(f"{store.build_dir(rec.build_id)}/lease.json")


def test_an_opt_in_tmpfs_work_dir_caps_its_size_and_keeps_change_sets_whole(docker_client, sandbox_cfg, envs):
    """`sandbox.work_tmpfs_mb` (for overlay2 on ext4, where no writable-layer cap exists): the work dir
    is a size-capped tmpfs holding the image's files with their owners; the agent's changes in it are
    found exactly as on the root filesystem (same change set as a plain sandbox doing the same)."""
    from trajforge.tasks.judge.verifier import restore_state

    env = next(e for e in envs.values() if len(e.files) > 1)
    capped = sandbox_cfg.model_copy(update={"work_tmpfs_mb": 8})
    script = ("set -e; a=$(find . -type f | sort | sed -n 1p); b=$(find . -type f | sort | sed -n 2p); "
              "echo more >> \"$a\"; rm \"$b\"; mkdir -p out; echo made > out/new.txt")
    seen = {}
    for name, cfg in (("plain", sandbox_cfg), ("tmpfs", capped)):
        with Sandbox(docker_client, env.image, cfg, workdir=env.workdir) as s:
            listing = s.exec("find . | sort; stat -c '%U %a' .", 20).output
            kind = s.exec(f"stat -f -c %T {env.workdir}", 10).output.strip()
            assert s.exec(script, 20).exit_code == 0
            full = s.exec("head -c 20M /dev/zero > big; echo rc=$?; rm -f big", 30).output
            changes = s.changes()
            after = s.exec("(find . -type f -exec stat -c '%n %U %a %s' {} +; find . ! -type f -exec stat -c '%n %U %a %F' {} +) | sort", 20).output
            state = s.get_archive(env.workdir, 8 << 20)
        with Sandbox(docker_client, env.image, cfg, workdir=env.workdir) as s:  # what verification does
            restore_state(s, state)
            restored = s.exec("(find . -type f -exec stat -c '%n %U %a %s' {} +; find . ! -type f -exec stat -c '%n %U %a %F' {} +) | sort", 20).output
        assert restored == after, name
        seen[name] = (listing, kind, full, changes)
    assert seen["tmpfs"][0] == seen["plain"][0], "the image's work dir, owners and modes are all there"
    assert seen["tmpfs"][1] == "tmpfs" and seen["plain"][1] != "tmpfs"
    assert "No space left on device" in seen["tmpfs"][2] and "rc=0" in seen["plain"][2]
    plain, tmpfs = seen["plain"][3], seen["tmpfs"][3]
    assert tmpfs.added == plain.added and tmpfs.modified == plain.modified and tmpfs.deleted == plain.deleted
    assert len(plain.modified) == 1 and len(plain.deleted) == 1 and any(p.endswith("out/new.txt") for p in plain.added)


def test_a_tmpfs_work_dir_hides_nothing_behind_the_agents_chmod(docker_client, sandbox_cfg):
    """Root here has no DAC capability and the engine's diff does not see a tmpfs: a folder the agent
    made unreadable to root in a tmpfs work dir used to hide what it added there, and `chmod 000` of its
    home hid every change of the work dir. The agent itself lists its `700`/`711` folders; what even it
    cannot list is opaque (the folder itself is the change), and taking the final state fails as the
    model's doing (`StateUnreadable`), not as an infrastructure fault that would be retried."""
    from trajforge.tasks.sandbox.errors import FinalStateUnavailable, SandboxError, StateUnreadable

    capped = sandbox_cfg.model_copy(update={"work_tmpfs_mb": 8})
    w = "/home/agent/work"
    cases = {
        "mkdir a b c && echo x > a/conftest.py && echo y > b/m.py && echo z > c/s.py && chmod 700 a && chmod 711 b "
        "&& chmod 000 c": ([f"{w}/a/conftest.py", f"{w}/b/m.py", f"{w}/c"], []),
        f"echo x > f && chmod 000 {w}": ([], [w]),
        # a name that is not UTF-8 (spelled `\\xff`) and a literal twin of that spelling
        "d=$(printf 'h\\377'); mkdir \"$d\" && echo x > \"$d/conftest.py\" && chmod 700 \"$d\" && mkdir 'h\\xff'":
            ([f"{w}/h\\xff/conftest.py"], []),
        "echo x > f && chmod 000 /home/agent": ([], [w]),
    }
    for script, (added, modified) in cases.items():
        with Sandbox(docker_client, sandbox_cfg.base_image, capped) as sb:
            assert sb.exec(script, 20).exit_code == 0
            for changes in (sb.settle([])[2], sb.changes()):
                # (settle also lists an image folder whose own owner or mode changed, read on the engine's host
                # since issue 41: here the agent's home after its chmod 000)
                meta = ["/home/agent"] if "000 /home/agent" in script and "/home/agent" in changes.modified else []
                assert (changes.added, changes.modified) == (added, sorted(meta + modified)), script
            if "000" not in script:  # everything in it is readable by its owner
                assert sb.get_archive(w, 1 << 20)
                continue
            with pytest.raises(SandboxError) as err:
                sb.get_archive(w, 1 << 20)
            assert err.type is StateUnreadable, script
    # sparse files whose archive outgrows the per-file limit: the model's doing, not a retried error
    with Sandbox(docker_client, sandbox_cfg.base_image, capped) as sb:
        assert sb.exec("truncate -s 1000M a && truncate -s 1000M b", 20).exit_code == 0
        with pytest.raises(SandboxError) as err:
            sb.get_archive(w, 1 << 20)
        assert isinstance(err.value, FinalStateUnavailable), err.value
    # more hidden folders than a command line can name (one argument holds 128 KiB): the agent walks the
    # whole work dir
    with Sandbox(docker_client, sandbox_cfg.base_image, capped) as sb:
        long = "x" * 200
        script = f"for i in $(seq 400); do mkdir d${{i}}{long} && echo x > d${{i}}{long}/f && chmod 700 d${{i}}{long}; done"
        assert sb.exec(script, 60).exit_code == 0
        for changes in (sb.changes(cap=1000), sb.settle([], cap=1000)[2]):
            assert sorted(changes.added) == sorted(f"{w}/d{i}{long}/f" for i in range(1, 401))


def test_more_files_than_the_change_walk_lists_fail_the_episode_not_the_infrastructure(docker_client):
    """An agent that leaves more files than the change walk may list (64 MiB of records by default;
    32 KiB here) used to raise an infrastructure error, retried and finally counted as `infra_error`
    (no label). It is the model's failure: the episode keeps its status, has no final state (so it
    verifies as failed) and says why."""
    import asyncio

    from trajforge.schemas.config import SandboxConfig
    from trajforge.schemas.trajectory import Message
    from trajforge.tasks.agent.harness import EpisodeSettings, run_episode
    from trajforge.tasks.envs.images import ensure_image
    from trajforge.tasks.sandbox.errors import ChangesTooLarge
    from trajforge.tasks.teachers.base import Turn

    class Small(Sandbox):
        walk_cap = 32 << 10

    class Teacher:
        async def next_turn(self, messages, tools):
            text = "```bash\nmkdir many && cd many && seq 1 3000 | xargs touch\n```" if len(messages) == 2 else "done"
            return Turn(Message(role="assistant", content=text), completion_tokens=5, finish_reason="stop")

    env = EnvSpec(env_id="many", family="f", level=1, seed=0, instruction="make files",
                  tests=[FileSpec(path="test_x.py", content="def test_a(): pass")])
    env.image, _ = ensure_image(docker_client, "trajforge/base:latest", env)
    with Small(docker_client, env.image, SandboxConfig(), workdir=env.workdir) as sb:
        assert sb.exec("mkdir many && cd many && seq 1 3000 | xargs touch", 30).exit_code == 0
        with pytest.raises(ChangesTooLarge):
            sb.changes()
    s = EpisodeSettings(max_turns=2, command_timeout_s=20, episode_timeout_s=120, tool_calling=False)
    r = asyncio.run(run_episode(env, Teacher(), lambda: Small(docker_client, env.image, SandboxConfig(),
                                                              workdir=env.workdir), s, "t", 0))
    assert r.steps and r.steps[0].exit_code == 0
    assert r.final_state is None and r.changes is None and "change walk" in (r.error or ""), r.error
