"""Replay of recorded trajectories (JSONL / Parquet) and the vLLM server's failure modes that need no
model: a missing model, a missing interpreter, a server process that dies during start-up."""

from __future__ import annotations

import json
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import small_config

from trajforge.schemas.config import parse_config
from trajforge.tasks.agent.driver import run_episodes
from trajforge.tasks.engine import StageContext
from trajforge.tasks.envs.families import get_family
from trajforge.tasks.envs.images import ensure_image
from trajforge.tasks.teachers import make_teacher
from trajforge.tasks.teachers.recorded import load_recorded
from trajforge.tasks.teachers.vllm_server import TeacherServerError, VLLMServer, resolve_model


def _write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))


def test_recorded_file_formats_and_rejects(tmp_path):
    call = {"id": "c", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": "ls -a"})}}
    rows = [
        {"env_id": "e1", "commands": ["ls", "cat x"]},
        {"env_id": "e1", "messages": [{"role": "user", "content": "go"},
                                      {"role": "assistant", "content": None, "tool_calls": [call]},
                                      {"role": "tool", "content": "ok", "tool_call_id": "c"},
                                      {"role": "assistant", "content": "now\n```bash\nwc -l x\n```"}]},
        "{not json",
        {"commands": ["ls"]},
        {"env_id": "e2", "commands": "rm -rf /"},
        {"env_id": "e3"},
        {"env_id": "e4", "messages": [{"role": "assistant", "tool_calls": [
            {"function": {"name": "bash", "arguments": "{broken"}}]}]},
    ]
    path = tmp_path / "t.jsonl"
    _write_jsonl(path, rows)
    recs, rejects = load_recorded(str(path))
    assert [r.commands for r in recs] == [["ls", "cat x"], ["ls -a", "wc -l x"]]
    assert [(r.key, r.reason) for r in rejects] == [
        ("t.jsonl:3", "bad_json"), ("t.jsonl:4", "no_env"), ("t.jsonl:5", "bad_commands"),
        ("t.jsonl:6", "no_commands"), ("t.jsonl:7", "bad_messages")]
    pq.write_table(pa.Table.from_pylist([{"env_id": "e1", "commands": ["ls"]}]), tmp_path / "t.parquet")
    assert load_recorded(str(tmp_path / "t.parquet"))[0][0].commands == ["ls"]
    with pytest.raises(ValueError, match="not found"):
        load_recorded(str(tmp_path / "missing.jsonl"))


@pytest.mark.docker
def test_replay_teacher_runs_recorded_commands(tmp_path, docker_client):
    env = get_family("log_report").generate(1, 0)
    env.image, _ = ensure_image(docker_client, "trajforge/base:latest", env)
    path = tmp_path / "rec.jsonl"
    _write_jsonl(path, [{"env_id": env.env_id, "commands": ["ls logs", "wc -l logs/app-0.log"]},
                        {"env_id": env.env_id, "commands": env.solution}])
    cfg = small_config(tmp_path / "runs", **{"teacher": {"backend": "replay", "replay": {"source": str(path)}}})
    ctx = StageContext.create(parse_config(cfg), "b")
    assert make_teacher(ctx.config.teacher).label == "replay:rec.jsonl"
    res = run_episodes(ctx, {env.env_id: env}, [(env.env_id, 0), (env.env_id, 1)])
    first, second = res.rows
    assert [s.command for s in first.steps] == ["ls logs", "wc -l logs/app-0.log"] and first.status == "ok"
    assert first.steps[1].exit_code == 0 and "20 logs/app-0.log" in first.messages[5].content
    assert [s.command for s in second.steps] == env.solution


def test_vllm_model_and_interpreter_errors_are_clear(tmp_path, monkeypatch):
    with pytest.raises(TeacherServerError, match="make teacher"):
        monkeypatch.setenv("TRAJFORGE_CACHE", str(tmp_path))
        resolve_model("embedded:nope")
    with pytest.raises(TeacherServerError, match="not a Hugging Face model folder"):
        resolve_model(str(tmp_path))


def test_vllm_server_that_dies_at_start_up_reports_its_log(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    # an interpreter without vLLM: the server process exits at once with ModuleNotFoundError
    cfg = parse_config({"dataset": "x", "synthesize": {"families": [{"name": "log_report"}]},
                        "teacher": {"backend": "vllm", "vllm": {"model": str(tmp_path / "model"),
                                                                 "python": sys.executable}}})
    with pytest.raises(TeacherServerError) as err:
        with VLLMServer(cfg.teacher, tmp_path / "vllm.log"):
            pass
    assert "exited with code 1" in str(err.value) and "No module named" in str(err.value)
    assert "vllm.entrypoints.openai.api_server" in (tmp_path / "vllm.log").read_text()


def test_replay_answers_in_the_format_the_harness_offers():
    """With tools offered: tool calls, then `submit`; without (fenced mode, as for SmolLM2): fenced
    bash blocks, then SUBMIT, so its trajectories share the prompt format of a model teacher's."""
    import asyncio

    from trajforge.schemas.config import teacher_config
    from trajforge.tasks.agent import FENCE, TOOLS
    from trajforge.tasks.teachers import ReplayTeacher

    env = get_family("log_report").generate(1, 0)
    fenced = ReplayTeacher(teacher_config({})).session(env, 0)
    turns = [asyncio.run(fenced.next_turn([], [])) for _ in range(len(env.solution) + 1)]
    assert [FENCE.findall(t.message.content)[0].strip() for t in turns[:-1]] == [c.strip() for c in env.solution]
    assert turns[-1].message.content == "SUBMIT" and not any(t.message.tool_calls for t in turns)
    tools = ReplayTeacher(teacher_config({})).session(env, 0)
    first = asyncio.run(tools.next_turn([], TOOLS)).message.tool_calls[0]
    assert first.function.name == "bash" and json.loads(first.function.arguments)["command"] == env.solution[0]
