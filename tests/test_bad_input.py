"""Bad input, each with a clear one-line error and nothing lost: configs that are not UTF-8 or give a
key twice, build ids that are paths, mistyped datasets, a dedup threshold MinHash cannot honour, task
folders whose import raises anything, malformed tool calls and lone surrogates from a model, no Docker
engine or base image for `verify`, `images prune` with no runs folder, recordings longer than the
default turn limit."""

from __future__ import annotations

import json
import os
import posixpath
from pathlib import Path

import pytest
import yaml
from helpers import run_cli, small_config
from typer.testing import CliRunner

from trajforge.flows.cli import app
from trajforge.schemas.config import MAX_DEDUP_THRESHOLD, ConfigError, load_config, parse_config

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def _cli(*args: str):
    """The CLI in-process: (exit code, error lines)."""
    res = CliRunner().invoke(app, list(args))
    return res.exit_code, [x for x in res.output.splitlines() if x.startswith("error:")]


def _write_config(tmp_path: Path, text: bytes | str, name: str = "c.yaml") -> Path:
    p = tmp_path / name
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    return p


def test_a_config_that_is_not_utf8_is_one_line_naming_the_line(tmp_path):
    path = _write_config(tmp_path, b"dataset: x\n# caf\xe9 au lait\nsynthesize: {families: [{name: log_report}]}\n")
    with pytest.raises(ConfigError, match=r"line 2: not UTF-8 text \(byte 0xe9"):
        load_config(path)
    code, errors = _cli("build", str(path))
    assert code == 2 and len(errors) == 1 and str(path) in errors[0] and "not UTF-8" in errors[0]


def test_a_key_given_twice_is_an_error_naming_the_key_and_line(tmp_path):
    path = _write_config(tmp_path, "dataset: x\nsynthesize:\n  families: [{name: log_report}]\n"
                                   "rollout:\n  max_turns: 3\n  max_turns: 30\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert "line 6" in str(err.value) and "duplicate key 'max_turns' (first given on line 5)" in str(err.value)
    code, errors = _cli("build", str(path))
    assert code == 2 and len(errors) == 1 and "duplicate key 'max_turns'" in errors[0]
    # a merge key may still be overridden (that is what it is for)
    ok = _write_config(tmp_path, "dataset: x\nsynthesize:\n  families: [{name: log_report}]\n"
                                 "rollout:\n  <<: {max_turns: 3, samples_per_env: 1}\n  max_turns: 5\n", "ok.yaml")
    assert (load_config(ok).rollout.max_turns, load_config(ok).rollout.samples_per_env) == (5, 1)


@pytest.mark.parametrize("build_id", ["../x", "/tmp/elsewhere", "a/b", ".."])
def test_a_build_id_that_is_a_path_is_refused_and_nothing_is_created(tmp_path, build_id):
    runs = tmp_path / "runs"
    path = _write_config(tmp_path, json.dumps(small_config(runs)))
    code, errors = _cli("build", str(path), "--build", build_id)
    assert code == 2 and errors == [f"error: invalid build id {build_id!r}: use letters, digits, '.', '_' and '-' "
                                    "(a name, not a path)"]
    assert not runs.exists()
    runs.mkdir()
    (runs / "t").mkdir()
    for cmd in (["status", build_id], ["explain", build_id], ["stage", "verify", "--build", build_id],
                ["publish", "org/x", "--build", build_id]):
        code, errors = _cli(*cmd, "--runs", str(runs), "--dataset", "t")
        assert code == 2 and len(errors) == 1 and "invalid build id" in errors[0], (cmd, errors)
    assert sorted(p.name for p in tmp_path.rglob("*")) == sorted(["c.yaml", "runs", "t"])


def test_status_of_a_mistyped_dataset_creates_nothing(tmp_path):
    runs = tmp_path / "runs"
    (runs / "demo").mkdir(parents=True)
    for cmd in (["status"], ["explain"], ["publish", "org/x"]):
        code, errors = _cli(*cmd, "--runs", str(runs), "--dataset", "dmeo")
        assert code == 2 and errors == [f"error: no dataset 'dmeo' under {runs} (datasets there: demo)"], errors
    code, errors = _cli("status", "--runs", str(runs), "--dataset", "../demo")
    assert code == 2 and "invalid dataset name '../demo'" in errors[0]
    assert sorted(p.name for p in runs.iterdir()) == ["demo"]


def test_dedup_threshold_above_what_minhash_separates_is_refused(tmp_path):
    base = {"dataset": "x", "synthesize": {"families": [{"name": "log_report"}]}}
    with pytest.raises(ConfigError) as err:
        parse_config({**base, "synthesize": {**base["synthesize"], "dedup_threshold": 1.0}}, "c.yaml")
    lines = str(err.value).splitlines()
    assert len(lines) == 2 and lines[1].startswith("  synthesize.dedup_threshold:") and "null" in lines[1]
    # the bound is the real one: datasketch builds its index at the bound and refuses just above it
    from datasketch import MinHashLSH

    from trajforge.tasks.envs.families import get_family
    from trajforge.tasks.envs.validator import dedup

    envs = [get_family("log_report").generate(1, s) for s in (0, 0, 1)]
    envs[1] = envs[1].model_copy(update={"env_id": "copy"})
    assert dedup(envs, MAX_DEDUP_THRESHOLD) == {"copy": envs[0].env_id}
    with pytest.raises(ValueError, match="bands"):
        MinHashLSH(threshold=MAX_DEDUP_THRESHOLD + 0.01, num_perm=128)
    assert parse_config({**base, "synthesize": {**base["synthesize"], "dedup_threshold": None}})


def test_a_task_folder_whose_import_raises_anything_is_one_reject_and_the_stage_goes_on(tmp_path, monkeypatch):
    import shutil

    from trajforge.tasks.engine import StageContext
    from trajforge.tasks.envs.formats import FORMATS, TaskFormat
    from trajforge.tasks.propose import ProposeStage

    class Fragile(TaskFormat):  # e.g. a plugin's format with a bug its author never hit
        name, marker, source = "fragile", "fragile.json", "fragile"

        def read(self, folder):
            return json.loads((Path(folder) / self.marker).read_text())["task"]["instruction"].upper()

    monkeypatch.setitem(FORMATS, "fragile", Fragile())
    tasks = tmp_path / "tasks"
    shutil.copytree(FIXTURES / "harbor" / "count-words", tasks / "good")
    (tasks / "bad").mkdir()
    (tasks / "bad" / "fragile.json").write_text('{"task": null}')
    cfg = parse_config(small_config(tmp_path / "runs", **{"synthesize": {"imports": [str(tasks)]}}))
    ctx = StageContext.create(cfg, "b")
    stage = ProposeStage()
    stage.config_section(cfg)  # fingerprinting reads every folder too
    shards = stage.plan(ctx, {})
    results = [stage.run_shard(ctx, s, {}) for s in shards]
    rows = [r for res in results for r in res.rows]
    rejects = [r for res in results for r in res.rejects]
    assert [r.source for r in rows] == ["harbor"]
    assert len(rejects) == 1 and rejects[0].reason == "import_malformed" and rejects[0].key.endswith("bad")
    assert "cannot be imported: TypeError: 'NoneType' object is not subscriptable" in rejects[0].detail


def test_images_prune_without_a_runs_folder_refuses_unless_all(tmp_path):
    code, errors = _cli("images", "prune", "--runs", str(tmp_path / "runs"))
    assert code == 2 and len(errors) == 1
    assert f"no runs folder at {tmp_path / 'runs'}" in errors[0] and "--all" in errors[0]
    assert not (tmp_path / "runs").exists()


def test_verify_without_docker_is_one_line(tmp_path):
    traj = tmp_path / "t.jsonl"
    traj.write_text(json.dumps({"env_id": "log_report-l1-s0", "commands": ["ls"]}) + "\n")
    out = run_cli("verify", "--trajectories", str(traj), "--out", str(tmp_path / "out"), cwd=tmp_path,
                  env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    errors = [x for x in out.stderr.splitlines() if x.startswith("error:")]
    assert out.returncode == 1 and len(errors) == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert "cannot reach a Docker engine" in errors[0] and "dockerd --bridge=none" in errors[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.docker
def test_verify_without_the_base_image_is_one_line(tmp_path, docker_client):
    traj = tmp_path / "t.jsonl"
    traj.write_text(json.dumps({"env_id": "log_report-l1-s0", "commands": ["ls"]}) + "\n")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(small_config(tmp_path / "runs", **{"sandbox.base_image": "trajforge/gone:latest"})))
    out = run_cli("verify", "--trajectories", str(traj), "--config", str(cfg), "--out", str(tmp_path / "out"),
                  cwd=tmp_path)
    errors = [x for x in out.stderr.splitlines() if x.startswith("error:")]
    assert out.returncode == 1 and len(errors) == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert "base image 'trajforge/gone:latest' is missing" in errors[0]


@pytest.mark.docker
def test_verify_replays_recordings_longer_than_the_default_turn_limit(tmp_path, docker_client):
    from trajforge.flows.reverify import reverify
    from trajforge.tasks.envs.families import get_family

    env = get_family("log_report").generate(1, 0)
    default = parse_config(small_config(tmp_path / "runs")).rollout.max_turns
    padding = [f"echo step {i} >/dev/null" for i in range(default + 3)]
    traj = tmp_path / "long.jsonl"
    traj.write_text(json.dumps({"trajectory_id": "long", "env_id": env.env_id,
                                "commands": padding + env.solution}) + "\n")
    verdicts, rejects, stats = reverify(str(traj), [])
    assert rejects == [] and [v.rollout_id for v in verdicts] == ["long"]
    assert verdicts[0].passed, "the solution at the end of a long recording must be replayed"


@pytest.mark.docker
def test_malformed_tool_calls_and_lone_surrogates_are_format_errors_never_a_crashed_shard(tmp_path, docker_client):
    from fake_openai import FakeOpenAI

    from trajforge.schemas.trajectory import Rollout
    from trajforge.tasks.agent.driver import run_episodes
    from trajforge.tasks.engine import StageContext
    from trajforge.tasks.envs.families import get_family
    from trajforge.tasks.envs.images import ensure_image

    env = get_family("log_report").generate(1, 0)
    env.image, _ = ensure_image(docker_client, "trajforge/base:latest", env)
    replies = [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c0", "type": "function"}]},  # no function
        {"role": "assistant", "content": "here: \ud800 ```bash\nls\n```"},  # a lone surrogate (JSON \ud800)
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c2", "type": "function", "function": {
            "name": None, "arguments": {"command": "ls"}}}]},  # no name; arguments an object
    ]
    with FakeOpenAI("ok", lambda req, n: replies[min(n, 3) - 1]) as srv:
        cfg = small_config(tmp_path / "runs")
        cfg["teacher"] = {"backend": "openai", "endpoints": [srv.url], "model": "fake", "retries": 0,
                          "request_timeout_s": 5, "tool_calling": True}
        cfg["rollout"].update(max_turns=6, command_timeout_s=10)
        ctx = StageContext.create(parse_config(cfg), "b")
        res = run_episodes(ctx, {env.env_id: env}, [(env.env_id, 0)])
        assert "\\ud800" not in json.dumps(srv.bodies[-1]), "the repaired text is what is sent back"
    (r,) = res.rows
    assert r.status == "format_error" and r.turns == 3 and r.steps == [], (r.status, r.error)
    feedback = [m.content for m in r.messages if m.content and m.content.startswith("format error")]
    assert len(feedback) == 3 and "invalid Unicode" in feedback[1]
    assert [m.content for m in r.messages if m.role == "assistant"][1] == "here: \ufffd ```bash\nls\n```"
    part = posixpath.join(ctx.store.stage_dir("b", "rollout", "fp"), "part-00000.parquet")
    assert ctx.store.write_records(part, Rollout, res.rows) == 1
    assert ctx.store.read_records([part], Rollout)[0].status == "format_error"


@pytest.mark.slow
def test_a_prefect_api_server_that_cannot_start_is_named_at_once_with_its_output(tmp_path, monkeypatch):
    """The build's own API server whose database cannot be opened exits: the driver says so with the server's exit
    code and the cause from its output as soon as it exits, not after the 240 s start-up timeout, and leaves no
    process behind."""
    import time

    from trajforge.flows.runtime import ApiServer

    monkeypatch.setenv("PREFECT_API_DATABASE_CONNECTION_URL", f"sqlite+aiosqlite:///{tmp_path}/missing/dir/prefect.db")
    server = ApiServer()
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"exited with code \d+ before it answered") as err:
        server.start(timeout=240)
    assert time.monotonic() - t0 < 120 and "unable to open database file" in str(err.value), str(err.value)[-800:]
    assert server.process is None
    # as a build meets it (`ensure_prefect_api`): the same error, and no PREFECT_API_URL left naming the dead server
    # (a later build in this process would attach to it)
    from trajforge.flows import runtime

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    with pytest.raises(RuntimeError, match=r"exited with code \d+ before it answered"):
        runtime.ensure_prefect_api()
    assert runtime._server is None and "PREFECT_API_URL" not in os.environ
