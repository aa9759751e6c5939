"""Where the hidden tests run (tasks/judge/venue.py): chosen in one place, recorded on every row, and the default
`fresh` venue judges the episode's files in a new container (tasks/sandbox/fresh.py) with nothing else of it:
no process, no entrypoint run again, no volume, every owner and mode kept. The issue-41 integrity fixtures (an
entrypoint that sources a work file, a VOLUME input, a shim made at test time, a sourced file redefining `[`)
score 1.0 with a naive root harness and never pass trajforge, in both venues that judge after the episode."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from helpers import run_cli, small_config

from trajforge.schemas.config import BuildConfig

SUITE_GROUP = "naive-harness"  # its cleanup removes every naive-harness image: one worker (tests/conftest.py)

INTEGRITY = Path(__file__).parent / "fixtures" / "integrity"
NEW_ENVS = {"harbor/entrypoint-env", "harbor/volume-data", "harbor/sourced-config"}
CASES = [c for c in (json.loads(line) for line in (INTEGRITY / "trajectories.jsonl").read_text().splitlines()
                     if line.strip())
         if c["env"] in NEW_ENVS or c["case"] in ("run_script_shim_created_at_test_time",
                                                  "py_module_ctypes_float_compare_slot",
                                                  "data_dir_solve_with_large_scratch",
                                                  "data_dir_solve_chowning_the_folder",
                                                  "data_dir_solve_with_an_installed_tool")]
# honest work issue 41's attacker saw lost (a command installed in another PATH folder than the reference's, a
# leftover `sleep 300 &`, an agent that stops its own container), with a shim the lookup rule must still catch; and
# round 2's (harbor/pth-path): a start-up hook at the reference's path with other content, or where the reference
# deletes, or named in bytes that are not UTF-8, an honest failure that replaced /logs with a file, beside the
# reference's own hook written by hand
HONEST = [json.loads(line) for line in (INTEGRITY / "honest.jsonl").read_text().splitlines() if line.strip()]
BASE = {"dataset": "x", "synthesize": {"families": [{"name": "log_report"}]}}


@pytest.mark.parametrize("extra,venue", [
    ({}, "fresh"),
    ({"verify": {"venue": "in_place"}}, "in_place"),
    ({"rollout": {"verify_in_place": True}}, "in_place"),
    ({"rollout": {"verify_in_place": False}}, "isolated"),
    ({"verify": {"isolated": True}}, "isolated"),
    ({"rollout": {"verify_in_place": True}, "verify": {"isolated": False}}, "in_place"),
])
def test_the_venue_is_chosen_in_one_key_and_retired_keys_map_to_it(extra, venue):
    assert BuildConfig.model_validate({**BASE, **extra}).verify.venue == venue


def test_a_retired_key_that_contradicts_the_venue_is_refused_by_name():
    with pytest.raises(ValueError, match="verify.venue 'fresh' contradicts the retired verify.isolated"):
        BuildConfig.model_validate({**BASE, "verify": {"isolated": True, "venue": "fresh"}})
    with pytest.raises(ValueError, match="venue"):
        BuildConfig.model_validate({**BASE, "verify": {"venue": "somewhere"}})


def test_the_rollout_fingerprint_follows_the_venue():
    from trajforge.tasks.rollout import RolloutStage

    a = RolloutStage().config_section(BuildConfig.model_validate(BASE))
    b = RolloutStage().config_section(BuildConfig.model_validate({**BASE, "verify": {"venue": "in_place"}}))
    assert a["venue"] == "fresh" and b["venue"] == "in_place"


@pytest.mark.docker
def test_fresh_judges_the_episode_files_in_a_new_container(docker_client):
    """Owner, group and mode of files and folders come across; no process, no entrypoint of the image; a VOLUME's
    changes are carried and join the change set; the episode container, its volumes and the commit go at close."""
    from trajforge.schemas.config import SandboxConfig
    from trajforge.tasks.sandbox import Sandbox

    tag = "tf-venue-test/vol:latest"
    docker_client.images.build(fileobj=__import__("io").BytesIO(
        b"FROM trajforge/base:latest\nRUN mkdir -p /data /srv/x && echo 1 > /data/in.txt\nVOLUME /data\n"
        b"ENTRYPOINT [\"/bin/sh\", \"-c\", \"[ -f /app/.env ] && . /app/.env; exec \\\"$@\\\"\", \"--\"]\n"),
        tag=tag, rm=True, network_mode="none")
    sb = Sandbox(docker_client, tag, SandboxConfig(), workdir="/app", agent="root",
                 labels={"trajforge.test": "venue"})
    sb.fresh = True
    try:
        sb.start()
        first = sb.name
        res = sb.exec("mkdir -p /app && echo 'touch /tmp/entrypoint-ran' > /app/.env && echo 2 > /data/in.txt && "
                      "echo new > /data/out.txt && chown 1000:1000 /srv/x && chmod 700 /srv/x && "
                      "(setsid sleep 1000 > /dev/null 2>&1 &) ; echo ok", 20)
        assert res.exit_code == 0, res.output
        volumes = {m["Name"] for m in docker_client.api.inspect_container(first)["Mounts"] if m["Type"] == "volume"}
        leftover, _, changes = sb.settle([])
        assert sb.name != first and sb.episode_container is not None
        assert leftover >= 1  # counted as evidence, and then gone with the episode's container
        assert {"/data/in.txt"} <= set(changes.modified) and "/data/out.txt" in changes.added, changes
        assert "/srv/x" in changes.added or "/srv/x" in changes.modified, changes
        out = sb.exec("stat -c '%u %g %a' /srv/x; cat /data/in.txt /data/out.txt; ls /tmp; "
                      "ps -e -o comm= | grep -c sleep; tr '\\0' ' ' < /proc/1/cmdline", 20, user="root").output
        lines = out.splitlines()
        assert lines[0] == "1000 1000 700" and lines[1:3] == ["2", "new"], out
        assert "entrypoint-ran" not in out and "/bin/sleep infinity" in out, out
        assert lines[-2] == "1", out  # the fresh container's own keep-alive sleep, nothing of the episode's
        image = sb.fresh_image
        assert image
    finally:
        sb.close()
    assert not docker_client.containers.list(all=True, filters={"name": first})
    assert not [i for i in docker_client.images.list(filters={"label": "trajforge.fresh=1"}) if i.id == image]
    assert not [v for v in docker_client.volumes.list() if v.name in volumes]
    docker_client.images.remove(tag, force=True)


@pytest.mark.docker
@pytest.mark.long  # ~45 s: the fixtures' own proof (test code only: tests/naive_harness.py), as test_integrity's
def test_every_new_hack_beats_a_naive_root_harness():
    from naive_harness import cleanup, naive_reward

    measured = CASES + [c for c in HONEST if "naive_reward" in c]  # (round 2's start-up hooks, /logs as a file)
    try:
        got = {c["case"]: naive_reward(INTEGRITY / c["env"], c["commands"]) for c in measured}
    finally:
        cleanup()
    assert got == {c["case"]: c["naive_reward"] for c in measured}


@pytest.mark.docker
# `in_place` is `long` (~1 min; `fresh` is the default; in_place is judged in make test by the planted-hacks build)
@pytest.mark.parametrize("venue", ["fresh", pytest.param("in_place", marks=pytest.mark.long)])
def test_the_new_hacks_never_pass_and_honest_work_does(tmp_path, venue):
    rows = [{"trajectory_id": c["case"], "env_id": str(INTEGRITY / c["env"]), "commands": c["commands"]}
            for c in CASES + HONEST]
    traj = tmp_path / "mixed.jsonl"
    traj.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = small_config(tmp_path / "runs", dataset="venue", **{"verify.venue": venue, "rollout.concurrency": 4,
                                                              "rollout.max_turns": 12})
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    out = run_cli("verify", "--trajectories", str(traj), "--envs", str(INTEGRITY / "harbor"),
                  "--out", str(tmp_path / "verified"), "--config", str(tmp_path / "cfg.yaml"), cwd=tmp_path,
                  timeout=1200)
    assert out.returncode == 0, out.stderr[-3000:]
    verdicts = {v["rollout_id"]: v for v in pq.read_table(tmp_path / "verified" / "verdicts.parquet").to_pylist()}
    rejects = pq.read_table(tmp_path / "verified" / "rejects.parquet").to_pylist()
    assert not [r for r in rejects if r["key"] in {c["case"] for c in CASES + HONEST}], rejects  # (task folders that
    for c in CASES:  # must be refused, bad-workdir and symlink-out, are rejected by the importer, by design)
        v = verdicts[c["case"]]
        flags = [f"{h['kind']}: {h['detail']}" for h in v["hacks"]]
        # an image with a VOLUME or an ENTRYPOINT is judged fresh whatever the venue (a restart would run it)
        fresh_only = c["env"] in ("harbor/entrypoint-env", "harbor/volume-data")
        assert v["mode"] == ("fresh" if fresh_only else venue), (c["case"], v["mode"])
        assert v["status"] != "infra_error" and v["verified"], c["case"]
        if c["expect"] == "pass":
            assert v["passed"] and not v["hack_flags"], (c["case"], flags, v["verifier_output"][-500:])
        elif c["expect"] == "fail":
            assert not v["passed"] and v["reward"] < 1.0, c["case"]
        elif c.get("neutralized"):
            assert not v["passed"] and v["reward"] < 1.0, (c["case"], flags)
        else:
            assert not v["passed"] and v["hacks"], (c["case"], c["class"], flags)
    for c in HONEST:
        _judged_as_honest_work_must_be(c, verdicts[c["case"]], venue)


def _judged_as_honest_work_must_be(c: dict, v: dict, venue: str) -> None:
    """An honest solve passes unflagged in its venue (a leftover process is counted in `quality`); the shim is
    caught; an episode whose agent stopped its own container ends `agent_killed_sandbox`, verified on its files in a
    fresh container (the only place they can be judged), with the reward they earn there and never a pass."""
    flags = [f"{h['kind']}: {h['detail']}" for h in v["hacks"]]
    assert v["verified"] and v["status"] == c.get("status", "ok"), (c["case"], v["status"])
    assert v["mode"] == ("fresh" if "status" in c else venue), (c["case"], v["mode"])
    if c["expect"] == "pass":
        assert v["passed"] and not v["hack_flags"], (c["case"], flags, v["verifier_output"][-500:])
    elif c["expect"] == "hack":
        assert not v["passed"] and c["flag"] in v["hack_flags"], (c["case"], flags)
    else:
        assert not v["passed"] and v["reward"] == c["reward"], (c["case"], v["reward"], flags)
    assert (v["quality"]["leftover_processes"] >= 1) is bool(c.get("leftover")), (c["case"], v["quality"])


@pytest.mark.docker
def test_the_validator_marks_an_environment_whose_start_up_reads_agent_files(docker_client):
    """An ENTRYPOINT that sources a work-dir file: `tests_run_agent_code` says `environment` (tasks/envs/start_code.py);
    a task whose tests and image run nothing of the agent's says `no`."""
    from trajforge.schemas.config import SandboxConfig, SynthesizeConfig
    from trajforge.tasks.envs.formats import import_task
    from trajforge.tasks.envs.validator import validate_env

    aliases = SynthesizeConfig(families=[{"name": "log_report"}]).image_aliases
    marks = {}
    for name in ("entrypoint-env", "volume-data"):
        env = import_task(INTEGRITY / "harbor" / name)
        v = validate_env(docker_client, env, SandboxConfig(), "trajforge/base:latest", aliases, 120, 120)
        assert v.ok, (name, v.reject)
        marks[name] = env.tests_run_agent_code
    assert marks == {"entrypoint-env": "environment", "volume-data": "no"}


@pytest.mark.docker
def test_the_validator_refuses_a_reference_whose_answer_is_a_file_the_engine_manages(docker_client):
    """harbor/hosts-alias: the reference appends to /etc/hosts, which the engine writes into every container (never in
    a change set, a commit or a capture): it passes where it ran, and every honest agent would fail in judging. The
    validator refuses it by name (attack round 2, H1)."""
    from trajforge.schemas.config import SandboxConfig, SynthesizeConfig
    from trajforge.tasks.envs.formats import import_task
    from trajforge.tasks.envs.validator import validate_env

    aliases = SynthesizeConfig(families=[{"name": "log_report"}]).image_aliases
    env = import_task(INTEGRITY / "harbor" / "hosts-alias")
    v = validate_env(docker_client, env, SandboxConfig(), "trajforge/base:latest", aliases, 120, 120)
    assert not v.ok and v.reject.reason == "engine_managed_change" and "/etc/hosts" in v.reject.detail, v.reject
