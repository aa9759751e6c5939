"""Format `terminal-bench` (1.x): `task.yaml` (`instruction`, `difficulty`, `max_agent_timeout_sec`,
`max_test_timeout_sec`), `Dockerfile` (+ context), `run-tests.sh`, `tests/`, `solution.sh` (or
`solution.yaml`, a list of `{command: ...}`); results parsed from pytest's `PASSED`/`FAILED` lines.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import yaml

from ....schemas.common import FileSpec
from ....schemas.config import safe_name
from ....schemas.environment import MAX_AGENT_TIMEOUT_S, MAX_TEST_TIMEOUT_S, EnvSpec
from . import base
from .base import TaskFormat, TaskFormatError, check_links, folder_digest


def import_terminal_bench(folder: Path) -> EnvSpec:
    folder = Path(folder)
    yaml_path = folder / "task.yaml"
    meta = base.yaml_mapping(yaml_path)
    instruction = meta.get("instruction")
    if instruction is None and isinstance(meta.get("descriptions"), list) and meta["descriptions"]:
        instruction = meta["descriptions"][0].get("description")
    instruction = base.instruction_text(instruction, yaml_path)
    check_links(folder)
    dockerfile = base.read_file(folder / "Dockerfile", "the environment's Dockerfile")
    context = base.file_specs(folder, exclude={"task.yaml", "solution.sh", "solution.yaml", "run-tests.sh", "tests",
                                      "docker-compose.yaml", "docker-compose.yml"})
    run_tests = base.read_file(folder / "run-tests.sh", "the test runner")
    tests = [FileSpec(path="run-tests.sh", content=run_tests, mode=0o755)]
    if (folder / "tests").is_dir():
        tests += base.file_specs(folder / "tests")
    if (folder / "solution.sh").exists():
        solution = [base.read_file(folder / "solution.sh", "the reference solution")]
    elif (folder / "solution.yaml").exists():
        steps = yaml.safe_load(base.read_file(folder / "solution.yaml", "the reference solution"))
        if not isinstance(steps, list) or not all(isinstance(s, dict) and isinstance(s.get("command"), str)
                                                  for s in steps):
            raise TaskFormatError(folder / "solution.yaml", "expected a list of {command: ...} steps")
        solution = [s["command"] for s in steps]
    else:
        raise TaskFormatError(folder / "solution.sh", "missing (the reference solution)")
    workdir = base.workdir_of(dockerfile, None, folder / "Dockerfile")
    difficulty = str(meta.get("difficulty", "medium")).lower()
    return EnvSpec(
        env_id=base.folder_env_id("tbench", folder, [folder_digest(folder)]),  # every file counts (context data too)
        family=f"terminal-bench:{safe_name(str(meta.get('category', 'task')))}", level=base.LEVELS.get(difficulty, 2),
        seed=0, source="terminal-bench", instruction=instruction.strip(), dockerfile=dockerfile, context=context,
        workdir=workdir, tests=tests, verifier="script",
        test_command=f"cd {shlex.quote(workdir)} && TEST_DIR=/tests bash /tests/run-tests.sh", solution=solution,
        agent_user="root",
        agent_timeout_s=base.number(meta.get("max_agent_timeout_sec"), yaml_path, "max_agent_timeout_sec",
                                     MAX_AGENT_TIMEOUT_S),
        test_timeout_s=base.number(meta.get("max_test_timeout_sec"), yaml_path, "max_test_timeout_sec",
                                    MAX_TEST_TIMEOUT_S),
        knobs_json=f'{{"imported_from": "{folder.name}"}}')


class TerminalBench(TaskFormat):
    name = "terminal-bench"
    marker = "task.yaml"

    def read(self, folder: Path) -> EnvSpec:
        return import_terminal_bench(folder)
