"""The command classifier and quality signals (pure), and `trajforge verify --trajectories` on files in
each accepted format, with bad rows rejected and the rest verified."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import run_cli

from trajforge.schemas.trajectory import Rollout, Step
from trajforge.tasks.envs.families import get_family
from trajforge.tasks.judge.quality import assess, label_steps

FIXTURES = Path(__file__).parent / "fixtures"


def steps(*cmds, codes=None):
    codes = codes or [0] * len(cmds)
    return [Step(turn=i + 1, command=c, exit_code=e, duration_s=0.1) for i, (c, e) in enumerate(zip(cmds, codes))]


@pytest.mark.parametrize("command,label", [
    ("ls -la", "inspect"), ("cat logs/app-0.log | head", "inspect"), ("grep -rn ERROR logs", "inspect"),
    ("find data -name '*.txt'", "inspect"), ("git log --oneline", "inspect"), ("sqlite3 shop.db '.schema'", "inspect"),
    ("echo 3 > count.txt", "act"), ("sed -i 's/a/b/' x.py", "act"), ("mv a b", "act"), ("mkdir out", "act"),
    ("python3 -c \"open('r.json','w').write('{}')\"", "act"), ("cat > fix.sh <<'EOF'\necho hi\nEOF", "act"),
    ("git checkout -b x", "act"), ("python3 validate.py service.json", "verify"), ("python3 -m pytest -q", "verify"),
    ("diff a b", "verify"), ("test -f report.json && echo ok", "verify"), ("grep foo x 2>/dev/null", "inspect"),
])
def test_command_classifier(command, label):
    assert label_steps(steps(command)) == [label]


def test_reading_back_what_was_written_is_verify():
    assert label_steps(steps("ls", "echo 5 > answer.txt", "cat answer.txt")) == ["inspect", "act", "verify"]


def test_quality_signals():
    r = Rollout(rollout_id="r", env_id="e", teacher="t", harness="h", sample=0, messages=[], status="ok",
                steps=steps("ls", "cat data.csv", "python3 conv.py", "echo x > out.json", "cat out.json",
                            "python3 conv.py --strict", "ls", "jq . out.json", codes=[0, 0, 1, 0, 0, 0, 0, 0]), turns=8)
    q = assess(r)
    assert q.labels == ["inspect", "inspect", "inspect", "act", "verify", "inspect", "inspect", "verify"]
    assert q.inspect_before_act and q.act_verify_share == 1.0 and q.ends_with_verify
    assert q.repeated_commands == 1 and q.failed_commands == 1 and q.recoveries == 1 and q.act_steps == 1
    blind = assess(Rollout(rollout_id="b", env_id="e", teacher="t", harness="h", sample=0, messages=[], status="ok",
                           steps=steps("echo 1 > a", "echo 2 > b")))
    assert not blind.inspect_before_act and blind.act_verify_share == 0.0 and not blind.ends_with_verify


def _rows():
    lr = get_family("log_report").generate(1, 0)
    call = {"id": "c0", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": lr.solution[0]})}}
    return lr, [
        {"trajectory_id": "solution", "env_id": lr.env_id, "commands": lr.solution},
        {"trajectory_id": "from-messages", "env_id": "log_report-l1-s0",
         "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": lr.instruction},
                      {"role": "assistant", "content": None, "tool_calls": [call]},
                      {"role": "tool", "tool_call_id": "c0", "content": "[exit code 0]"}]},
        {"trajectory_id": "lazy", "env_id": lr.env_id, "commands": ["ls logs"]},
        {"trajectory_id": "harbor", "env_id": "count-words", "commands": ["wc -w < /app/input.txt | tr -d ' ' > /app/count.txt"]},
        {"trajectory_id": "forged", "env_id": "count-words", "commands": ["echo 1 > reward.txt"]},
        {"trajectory_id": "ghost", "env_id": "no-such-env", "commands": ["ls"]},
        {"trajectory_id": "not-a-list", "env_id": lr.env_id, "commands": "ls"},
    ]


@pytest.mark.docker
@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_reverify_command_on_each_format(tmp_path, fmt):
    lr, rows = _rows()
    path = tmp_path / f"traj.{fmt}"
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "{broken json\n")
    else:  # Parquet cannot hold a str and a list in one column: commands/messages as JSON text
        pq.write_table(pa.Table.from_pylist([{**r, "commands": json.dumps(r["commands"]) if "commands" in r else None,
                                              "messages": json.dumps(r["messages"]) if "messages" in r else None}
                                             for r in rows]), path)
    out = run_cli("verify", "--trajectories", str(path), "--envs", str(FIXTURES / "harbor"), "--out",
                  str(tmp_path / "out"), cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    verdicts = {r["rollout_id"]: r for r in pq.read_table(tmp_path / "out" / "verdicts.parquet").to_pylist()}
    rejects = {r["key"]: r["reason"] for r in pq.read_table(tmp_path / "out" / "rejects.parquet").to_pylist()}
    assert verdicts["solution"]["passed"] and verdicts["from-messages"]["passed"] and verdicts["harbor"]["passed"]
    assert not verdicts["lazy"]["passed"] and verdicts["lazy"]["quality"]["labels"] == ["inspect"]
    assert not verdicts["forged"]["passed"] and "forge_reward" in verdicts["forged"]["hack_flags"]
    assert rejects["ghost"] == "unknown_env" and rejects["not-a-list"] == "bad_commands"
    if fmt == "jsonl":
        assert "bad_json" in rejects.values()


@pytest.mark.docker
def test_reverify_writes_only_its_out_folder(tmp_path):
    """`trajforge verify --out X` is no build: it leaves no `runs/reverify` behind in the folder it ran in
    (which made a bare `trajforge status` / `report` there pick or name a dataset `reverify`)."""
    lr = get_family("log_report").generate(1, 0)
    path = tmp_path / "traj.jsonl"
    path.write_text(json.dumps({"trajectory_id": "solution", "env_id": lr.env_id, "commands": lr.solution}) + "\n")
    out = run_cli("verify", "--trajectories", str(path), "--out", "X", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert pq.read_table(tmp_path / "X" / "verdicts.parquet").to_pylist()[0]["passed"]
    assert not (tmp_path / "runs").exists()
    status = run_cli("status", cwd=tmp_path)
    assert "reverify" not in status.stdout + status.stderr
