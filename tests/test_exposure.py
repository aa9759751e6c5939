"""Which tasks' hidden tests execute the agent's code (`EnvSpec.tests_run_agent_code`), read from the tests'
text and the solved work dir: the integrity fixtures each say what they do, and the mark errs towards
exposure."""

from pathlib import Path

import pytest

from trajforge.schemas.common import FileSpec
from trajforge.tasks.envs.formats import import_task
from trajforge.tasks.judge.exposure import tests_run_agent_code as exposure

FIXTURES = Path(__file__).parent / "fixtures" / "integrity"

# the solved work dir of each fixture (path -> executable) and what its reference solution changes elsewhere
SOLVED = {
    "harbor/py-module": ({"/app/stats.py": False}, [], "in_process"),
    "harbor/run-script": ({"/app/report.sh": False, "/app/sales.csv": False, "/app/total.txt": False}, [],
                          "subprocess"),
    "tbench/usr-local-tool": ({"/example.txt": False}, ["/usr/local/bin/revlines"], "subprocess"),
    "tbench/repair-script": ({"/app/make_report.sh": True, "/app/sales.csv": False}, [], "subprocess"),
    "harbor/data-dir": ({}, ["/data/total.txt"], "no"),
    "harbor/etc-config": ({"/app/settings.env": False}, ["/etc/ledger.conf"], "no"),
    "tbench/recompute-input": ({"/app/numbers.txt": False, "/app/answer.txt": False}, [], "no"),
}


@pytest.mark.parametrize("task", sorted(SOLVED))
def test_each_integrity_fixture_is_marked_by_what_its_tests_run(task):
    env = import_task(FIXTURES / task)
    solved, elsewhere, want = SOLVED[task]
    solved = {p.replace("/app", env.workdir.rstrip("/") or "", 1) if p.startswith("/app/") else p: x
              for p, x in solved.items()}
    assert exposure(env.tests, env.test_command, env.workdir, solved, elsewhere) == want


def test_a_module_import_needs_the_module_in_the_work_dir():
    tests = [FileSpec(path="test_outputs.py", content="import json\nfrom stats import mean\n")]
    assert exposure(tests, None, "/app", {"/app/data.csv": False}) == "no"
    assert exposure(tests, None, "/app", {"/app/stats.py": False}) == "in_process"
    assert exposure(tests, None, "/app", {"/app/stats/__init__.py": False}) == "in_process"


def test_loading_a_work_dir_file_as_code_is_in_process_and_a_data_file_is_not_code():
    runpy = [FileSpec(path="test_x.py", content="import runpy\nrunpy.run_path('/app/solve.py')\n")]
    assert exposure(runpy, None, "/app", {"/app/solve.py": False}) == "in_process"
    reads = [FileSpec(path="test.sh", content="diff /app/out.txt /tests/want.txt")]
    assert exposure(reads, None, "/app", {"/app/out.txt": True}) == "subprocess"  # executable: errs
    assert exposure(reads, None, "/app", {"/app/out.txt": False}) == "no"


def test_a_program_is_found_by_path_by_dot_slash_and_by_name_but_not_inside_another_word():
    solved = {"/app/run.sh": True}
    for text in ("bash /app/run.sh", "./run.sh --fast", "sh run.sh"):
        assert exposure([FileSpec(path="test.sh", content=text)], None, "/app", solved) == "subprocess"
    for text in ("cat /app/rerun.sh.bak", "echo prerun.sh"):
        assert exposure([FileSpec(path="test.sh", content=text)], None, "/app", solved) == "no"
    assert exposure([], "bash /app/run.sh && pytest", "/app", solved) == "subprocess"
