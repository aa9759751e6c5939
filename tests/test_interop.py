"""Harbor and Terminal-Bench 1.x task folders: import (with FROM aliases for images that cannot be
pulled offline), validation in Docker, export, and the round trip export -> import -> validate."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers import run_cli

from trajforge.schemas.config import SandboxConfig, SynthesizeConfig
from trajforge.tasks.envs.families import get_family
from trajforge.tasks.envs.formats import TaskFormatError, export_harbor, find_tasks, import_task
from trajforge.tasks.envs.validator import validate_env
from trajforge.tasks.judge.verifier import VERIFIER_CAPS, run_hidden_tests
from trajforge.tasks.sandbox import Sandbox

FIXTURES = Path(__file__).parent / "fixtures"
S = SynthesizeConfig(families=[{"name": "log_report"}])


def validate(client, env):
    sandbox = SandboxConfig()
    return validate_env(client, env, sandbox, sandbox.base_image, S.image_aliases, 60, 60)


def test_harbor_folder_is_parsed():
    env = import_task(FIXTURES / "harbor" / "count-words")
    assert env.source == "harbor" and env.verifier == "script" and env.test_command == "bash /tests/test.sh"
    assert env.workdir == "/app" and env.level == 1 and env.agent_timeout_s == 300 and env.test_timeout_s == 60
    assert env.dockerfile.startswith("FROM ubuntu:24.04") and [f.path for f in env.context] == ["Dockerfile", "input.txt"]
    assert {t.path for t in env.tests} == {"test.sh", "test_outputs.py"} and "wc -w" in env.solution[0]


def test_terminal_bench_folder_is_parsed():
    env = import_task(FIXTURES / "tbench" / "sort-names")
    assert env.source == "terminal-bench" and env.family == "terminal-bench:file-operations"
    assert "TEST_DIR=/tests bash /tests/run-tests.sh" in env.test_command and env.workdir == "/app"
    assert {f.path for f in env.context} == {"Dockerfile", "names.txt"}  # compose file, tests, solution left out


@pytest.mark.parametrize("breakage,where", [
    ("rm task.toml", "not a task folder"),
    ("rm instruction.md", "instruction.md: missing"),
    ("rm tests/test.sh", "tests/test.sh: missing"),
    ("printf '\\000\\377' > tests/expected.bin", "expected.bin: binary file"),  # no solve.sh is fine: oracle absent
    ("echo 'agent = [' > task.toml", "task.toml: not valid TOML"),
    ("printf '[agent]\\ntimeout_sec = \"soon\"\\n' > task.toml", "[agent].timeout_sec must be a positive number"),
    (": > instruction.md", "empty instruction"),
])
def test_malformed_task_folder_names_file_and_field(tmp_path, breakage, where):
    import subprocess

    task = tmp_path / "t"
    shutil.copytree(FIXTURES / "harbor" / "count-words", task)
    subprocess.run(breakage, shell=True, cwd=task, check=True)
    with pytest.raises(TaskFormatError) as err:
        import_task(task)
    assert where in str(err.value)


@pytest.mark.docker
@pytest.mark.parametrize("kind,name", [("harbor", "count-words"), ("tbench", "sort-names")])
def test_imported_tasks_pass_the_validator(docker_client, kind, name):
    env = import_task(FIXTURES / kind / name)
    v = validate(docker_client, env)
    assert v.ok, v.reject
    assert v.checks["noop_fails"] == "pass" and v.checks["solution_passes"] == "pass"


@pytest.mark.docker
def test_unpullable_image_without_alias_fails_with_the_build_log(docker_client):
    env = import_task(FIXTURES / "harbor" / "count-words")
    env.dockerfile = env.dockerfile.replace("ubuntu:24.04", "registry.example.com/private/img:1")
    v = validate(docker_client, env)
    assert v.reject.reason == "image_build_failed" and "registry.example.com/private/img" in v.reject.detail


def _verdicts(client, env):
    """Per-test results of doing nothing and of the reference solution."""
    out = []
    for solve in (False, True):
        with Sandbox(client, env.image, SandboxConfig(), workdir=env.workdir, cap_add=VERIFIER_CAPS) as sb:
            if solve:
                for cmd in env.solution:
                    assert sb.exec(cmd, 60).exit_code == 0
            out.append(run_hidden_tests(sb, env, 60).outcome())
    return out


@pytest.mark.docker
@pytest.mark.parametrize("family,level", [("git_recover", 2), ("python_bugfix", 3), ("sql_query", 3)])
def test_harbor_round_trip_keeps_environment_and_verdicts(docker_client, tmp_path, family, level):
    original = get_family(family).generate(level, 1)
    folder = export_harbor(original, tmp_path)
    assert find_tasks(tmp_path) == [folder]
    back = import_task(folder)
    assert back.instruction == original.instruction and back.workdir == original.workdir
    assert [back.solution[0].rstrip("\n")] == ["\n".join(original.solution)] and back.level == original.level
    assert validate(docker_client, original).ok
    v = validate(docker_client, back)
    assert v.ok, v.reject
    assert _verdicts(docker_client, back) == _verdicts(docker_client, original)


@pytest.mark.docker
def test_envs_cli_validate_import_export(tmp_path):
    out = run_cli("envs", "families", cwd=tmp_path)
    assert out.returncode == 0 and "shell_script" in out.stdout and "sql_query" in out.stdout
    out = run_cli("envs", "export", "csv_convert-l2-s0", str(tmp_path / "exported"), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    shutil.copytree(FIXTURES / "tbench" / "sort-names", tmp_path / "exported" / "sort-names")
    broken = tmp_path / "exported" / "broken"
    shutil.copytree(FIXTURES / "harbor" / "count-words", broken)
    (broken / "solution" / "solve.sh").write_text("echo 11 > /app/count.txt\n")
    out = run_cli("envs", "import", str(tmp_path / "exported"), "--out", str(tmp_path / "kept.jsonl"), cwd=tmp_path)
    assert out.returncode == 1  # one task is rejected
    assert "solution_fails" in out.stdout and out.stdout.count("kept") >= 2
    assert len((tmp_path / "kept.jsonl").read_text().splitlines()) == 2
    out = run_cli("envs", "validate", "file_search-l1-s4", cwd=tmp_path)
    assert out.returncode == 0 and "kept" in out.stdout
    out = run_cli("envs", "validate", "nope-l1-s0", cwd=tmp_path)
    assert out.returncode != 0 and "unknown environment family 'nope'" in out.stderr
