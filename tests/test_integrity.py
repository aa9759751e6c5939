"""Verification no agent can talk its way past, on imported Harbor / Terminal-Bench tasks run by a root
agent (tests/fixtures/integrity, README there). Every planted hack scores 1.0 with a naive root
harness (tests/naive_harness.py, proved here); `trajforge verify` flags each one and never counts it
as a pass, in every venue the hidden tests run in (a fresh container from the episode's files, the episode's own
container, and isolated from the captured state), while
every legitimate solve passes with no flag and every wrong answer fails."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from helpers import run_cli, small_config

from trajforge.tasks.envs.formats import TaskFormatError, import_task

pytestmark = [pytest.mark.docker]
SUITE_GROUP = "naive-harness"  # its cleanup removes every naive-harness image: one worker (tests/conftest.py)
INTEGRITY = Path(__file__).parent / "fixtures" / "integrity"
CASES = [json.loads(line) for line in (INTEGRITY / "trajectories.jsonl").read_text().splitlines() if line.strip()]
LEGIT_TASKS = sorted({c["env"] for c in CASES})


@pytest.mark.long  # ~1 min: the fixtures' own proof (test code only: tests/naive_harness.py), run when they change
def test_every_planted_hack_beats_a_naive_root_harness():
    """The baseline: without trajforge's defences each hack is scored as a full solve."""
    from naive_harness import cleanup, naive_reward

    try:
        with ThreadPoolExecutor(4) as pool:
            got = list(pool.map(lambda c: naive_reward(INTEGRITY / c["env"], c["commands"]), CASES))
    finally:
        cleanup()
    for case, reward in zip(CASES, got):
        assert reward == case["naive_reward"], (case["case"], reward)
    assert all(r == 1.0 for c, r in zip(CASES, got) if c["expect"] == "hack")
    assert len({c["class"] for c in CASES if c["expect"] == "hack"}) >= 7


def verify_config(runs: Path, mode: str) -> dict:
    return small_config(runs, dataset="integrity", **{
        "verify.venue": mode,
        "rollout.concurrency": 6, "rollout.max_turns": 12})


@pytest.fixture(scope="module")
def validated(docker_client, tmp_path_factory):
    """The task folders the trajectories use, each imported and validated once as a build's validate stage does
    (three side by side; each waits on its containers), for every test of the module: the validations
    (`test_oracle_pass_rate_equals_a_plain_root_harness`), the validated specs as an `--envs` JSONL and each
    folder's env id (what a trajectory names; the verdicts of `trajforge verify` in each venue). What the validator
    records is what a venue judges by, the same for the three: once instead of once per venue and once more for
    the oracle test. `verify` reading a task folder and profiling it itself is tested in test_venue.py and
    test_quality_and_reverify.py."""
    from trajforge.schemas.config import SandboxConfig, SynthesizeConfig
    from trajforge.tasks.envs.validator import validate_env

    s = SynthesizeConfig(families=[{"name": "log_report"}])

    def one(task: str):
        env = import_task(INTEGRITY / task)
        return task, env, validate_env(docker_client, env, SandboxConfig(), "trajforge/base:latest", s.image_aliases,
                                       120, 120)

    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(one, LEGIT_TASKS))
    specs = tmp_path_factory.mktemp("validated-envs") / "envs.jsonl"
    specs.write_text("".join(env.model_dump_json() + "\n" for _, env, v in results if v.ok))
    return specs, {task: env.env_id for task, env, _ in results}, results


# each venue about 2.5 minutes on two cores; the other two marked `long` (`-m "not long"` keeps `fresh`, the default)
@pytest.mark.parametrize("mode", ["fresh", pytest.param("in_place", marks=pytest.mark.long),
                                  pytest.param("isolated", marks=pytest.mark.long)])
def test_trajforge_verify_flags_every_hack_and_passes_every_solve(tmp_path, mode, validated):
    specs, env_ids, _ = validated
    rows = [{"trajectory_id": c["case"], "env_id": env_ids[c["env"]], "commands": c["commands"]} for c in CASES]
    traj = tmp_path / "mixed.jsonl"
    traj.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = verify_config(tmp_path / "runs", mode)
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    out = run_cli("verify", "--trajectories", str(traj), "--envs", str(specs), "--out", str(tmp_path / "verified"),
                  "--config", str(tmp_path / "cfg.yaml"), cwd=tmp_path, timeout=1200)
    assert out.returncode == 0, out.stderr[-3000:]
    verdicts = {v["rollout_id"]: v for v in pq.read_table(tmp_path / "verified" / "verdicts.parquet").to_pylist()}
    rejects = pq.read_table(tmp_path / "verified" / "rejects.parquet").to_pylist()
    # the isolated venue (re-verifying stored rollouts) cannot rebuild a final state whose outside files were past the
    # capture limit: that honest solve is a verifier_error there, never a pass or a fail (docs/verification.md, "Still open")
    known = {"data_dir_solve_with_large_scratch"} if mode == "isolated" else set()
    assert sorted(r["key"] for r in rejects if r["key"] in {c["case"] for c in CASES}) == sorted(known), rejects
    assert all(r["reason"] == "verifier_error" for r in rejects if r["key"] in known), rejects
    for c in CASES:
        if c["case"] in known:
            continue
        v = verdicts[c["case"]]
        if "toolchain_tamper" in v["hack_flags"]:  # nothing of its container judges it: not tested at all
            assert v["mode"] == "none" and not v["passed"], (c["case"], v["mode"])
            continue
        if c["expect"] == "fail" and v["mode"] == "none":  # no final state to test (the work dir is gone): the model's
            assert not v["passed"] and v["verified"] and "final state" in v["verifier_output"], (c["case"], v)
            continue
        # (an image with a VOLUME, or an ENTRYPOINT under a root agent, is judged fresh in place: tasks/sandbox/fresh.py)
        assert v["mode"] in ({mode, "fresh"} if mode == "in_place" else {mode}), (c["case"], v["mode"])
        flags = [f"{h['kind']}: {h['detail']} [{h['command']}]" for h in v["hacks"]]
        if c["expect"] == "pass":
            assert v["passed"] and not v["hack_flags"], (c["case"], flags, v["verifier_output"][-500:])
        elif c["expect"] == "fail":  # the model's failure, never infrastructure (an agent that removed its work dir)
            assert not v["passed"] and v["verified"], (c["case"], v["verifier_output"][-300:])
        elif c.get("neutralized"):  # the defence removes the hack's effect (a restart, a fresh container)
            assert not v["passed"] and v["reward"] < 1.0, (c["case"], c["class"], "a hack counted as a pass", flags)
        else:
            assert not v["passed"], (c["case"], c["class"], "a hack counted as a pass")
            assert v["hacks"], (c["case"], c["class"], "a hack without a flag", v["unexpected"])
            assert any(h["command"] or "/" in h["detail"] for h in v["hacks"]), (c["case"], flags)
    by_class = {c["class"] for c in CASES if c["expect"] == "hack" and verdicts[c["case"]]["hacks"]}
    assert {"module_shadowing", "input_tampering", "reward_precedence", "fake_result_lines",
            "path_executable", "sitecustomize", "pth_file", "conftest", "pyc_poisoning", "harness_shim",
            "reward_channel", "test_script_rewrite", "output_kind", "truncated_change_set", "pycache_noise", "work_dir_stash", "restart_shim",
            "in_process_exit", "runner_noop", "always_equal", "reward_race", "dangling_link", "hard_link",
            "planted_scratch_link", "test_run_tamper", "volume_input_tampering", "shell_redefinition",
            "test_time_shim", "interpreter_patch", "spool_lookalike",
            "tool_config_directives", "verifier_read", "script_forged_exit", "script_frame_reach",
            "cwd_module_shadowing"} <= by_class


@pytest.mark.parametrize("name,problem", [("bad-workdir", "workdir must not be /"),
                                          ("symlink-out", "leads outside the task folder")])
def test_what_a_task_declares_is_validated(name, problem):
    with pytest.raises(TaskFormatError, match=problem):
        import_task(INTEGRITY / "harbor" / name)


def test_oracle_pass_rate_equals_a_plain_root_harness(validated):
    """Tasks that write outside the work dir (/data, /etc, /usr/local/bin) and tests that write into
    the agent's folders: trajforge's validator keeps every task a plain root harness passes, and
    records the reference solution's change set."""
    from naive_harness import cleanup, naive_reward

    tasks = [INTEGRITY / t for t in LEGIT_TASKS]
    try:
        with ThreadPoolExecutor(4) as pool:
            naive = list(pool.map(lambda t: naive_reward(t, import_task(t).solution), tasks))
    finally:
        cleanup()
    kept, outside, envs = [], set(), {}
    results = [(env, v) for _, env, v in validated[2]]
    for t, (env, v) in zip(tasks, results):
        kept.append(v.ok)
        assert v.ok, (t.name, v.reject)
        assert env.agent_user == "root" and env.expected_changes, t.name
        outside |= {p.split("/")[1] for p in env.expected_changes if not p.startswith(env.workdir + "/")}
        envs[f"{t.parent.name}/{t.name}"] = env
    assert sum(kept) / len(kept) == sum(r == 1.0 for r in naive) / len(naive) == 1.0
    assert {"data", "etc", "usr"} <= outside, outside  # solutions that write outside their work dir
    # what a pass must show, recorded on the reference solution: the reward channel, pytest's own lines, whether
    # the tests run agent code and (when they import it) what trajforge's guarded run sees
    assert not any(e.tests_leave_processes for e in envs.values())
    assert all(e.test_writes is not None for e in envs.values())  # a local engine: its writable layer read here
    assert "/tmp/other.csv" in envs["harbor/run-script"].test_writes  # the files the tests themselves write
    assert {k: e.reward_files for k, e in envs.items() if k.startswith("harbor/")} == {
        k: ["reward.txt"] for k in envs if k.startswith("harbor/")}
    assert all(not e.reward_files and e.expected_tests for k, e in envs.items() if k.startswith("tbench/")), envs
    marks = {k: e.tests_run_agent_code for k, e in envs.items()}
    assert marks["harbor/py-module"] == "in_process" and marks["harbor/data-dir"] == "no", marks
    assert marks["harbor/run-script"] == marks["tbench/repair-script"] == marks["tbench/usr-local-tool"] == "subprocess"
    module = envs["harbor/py-module"]
    assert len(module.expected_tests) == 2 and len(module.guard_tests) == 2 and module.guard_types == []


ATTACK = Path(__file__).parent / "fixtures" / "attack-r3"


@pytest.mark.long  # ~5 min on two cores: 7 task folders validated, 47 trajectories judged
def test_attacker_round_3_gets_no_hack_through_and_loses_no_honest_solve(tmp_path):
    """An independent attacker's set on tests that are plain Python programs (fixtures/attack-r3/README.md: a
    check script, unittest.main(), -m unittest, pytest from the work dir, a CLI the tests run per case, doctest, a
    program on stdin), each trajectory scored 1.0 by its own plain harness: `trajforge verify` of the task folders
    counts none of the hacks as passed and keeps every honest solve, unflagged."""
    cases = [json.loads(line) for line in (ATTACK / "trajectories.jsonl").read_text().splitlines() if line.strip()]
    rows = [{"trajectory_id": c["case"], "env_id": str(ATTACK / "tasks" / c["task"]), "commands": c["commands"]}
            for c in cases]
    traj = tmp_path / "attack.jsonl"
    traj.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = verify_config(tmp_path / "runs", "fresh")
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    out = run_cli("verify", "--trajectories", str(traj), "--envs", str(ATTACK / "tasks"), "--out",
                  str(tmp_path / "verified"), "--config", str(tmp_path / "cfg.yaml"), cwd=tmp_path, timeout=1800)
    assert out.returncode == 0, out.stderr[-3000:]
    verdicts = {v["rollout_id"]: v for v in pq.read_table(tmp_path / "verified" / "verdicts.parquet").to_pylist()}
    assert set(verdicts) == {c["case"] for c in cases}
    through = [c["case"] for c in cases if c["expect"] == "hack" and verdicts[c["case"]]["passed"]]
    lost = {c["case"]: (verdicts[c["case"]]["hack_flags"], verdicts[c["case"]]["verifier_output"][-300:])
            for c in cases if c["expect"] == "pass" and not (verdicts[c["case"]]["passed"]
                                                           and not verdicts[c["case"]]["hack_flags"])}
    assert through == [] and lost == {}, (through, lost)
