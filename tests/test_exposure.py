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


def test_the_guarded_session_reads_settings_only_from_the_tasks_own_test_files():
    """pytest's rootdir rule, kept inside /tests: a repository's `pyproject.toml` with pytest's section beside its
    test tree is the settings file (and its folder the rootdir, as the reference's run had it); a `pyproject.toml`
    without that section is not; nothing above /tests counts (only the agent could have put it there)."""
    from trajforge.schemas.common import FileSpec
    from trajforge.schemas.environment import EnvSpec
    from trajforge.tasks.judge.guard import agent_dirs, settings_file

    def env(files: dict[str, str]) -> EnvSpec:
        return EnvSpec(env_id="e", family="harbor", level=1, seed=0, source="harbor", instruction="i",
                       verifier="script", workdir="/app", tests=[FileSpec(path=p, content=c) for p, c in files.items()])

    tree = env({"tree/pyproject.toml": "[tool.pytest.ini_options]\npythonpath = ['src']\n", "tree/tests/test_a.py": ""})
    assert settings_file(tree, ["/tests/tree/tests/test_a.py"]) == ("/tests/tree/pyproject.toml", "/tests/tree")
    bare = env({"tree/pyproject.toml": "[project]\nname = 'x'\n", "tree/setup.py": "", "tree/tests/test_a.py": ""})
    assert settings_file(bare, ["/tests/tree/tests/test_a.py"]) == (None, "/tests/tree")
    assert settings_file(env({"test_a.py": ""}), ["/tests/test_a.py"]) == (None, "/tests")
    # the episode's Python files outside the work dir, by name: the guard's audit hook counts their frames as agent code
    assert agent_dirs(["/app/x.py", "/usr/local/lib/python3.11/dist-packages/pkg/__init__.py", "/opt/tool/run.sh"],
                      "/app") == ["/usr/local/lib/python3.11/dist-packages/pkg/__init__.py"]


def test_make_over_the_work_dirs_makefile_runs_the_agents_recipes():
    solved = {"/app/Makefile": False, "/app/data.csv": False}
    assert exposure([FileSpec(path="test.sh", content="cd /app && make check")], None, "/app", solved) == "subprocess"
    assert exposure([], "make -C /app test", "/app", solved) == "subprocess"
    assert exposure([FileSpec(path="test.sh", content="cmake --version; echo remake")], None, "/app", solved) == "no"
    assert exposure([FileSpec(path="test.sh", content="make check")], None, "/app", {"/app/data.csv": False}) == "no"
