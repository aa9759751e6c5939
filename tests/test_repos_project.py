"""How a project installs and tests (tasks/envs/repos/project.py): small trees in tmp_path for each packaging
layout (pyproject, setup.py read never run, setup.cfg, requirement files, dependency groups), the test runner's
evidence and paths, overrides, bad trees as named errors, and one real pytest run of `test_command` whose JUnit
report `testlists.parse_junit` reads back to the node ids that select the tests again."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trajforge.tasks.envs.repos.project import TEST_ENV, ProjectError, detect, kept_addopts, test_command
from trajforge.tasks.envs.repos.testlists import parse_junit

PIP = ("python", "-m", "pip", "install")


def make(root: Path, files: dict[str, str | bytes]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return root


PYPROJECT = """\
[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "ranges"
version = "1.2.0"
requires-python = ">=3.9"
dependencies = ["attrs"]

[project.optional-dependencies]
docs = ["sphinx"]
test = ["pytest>=8", "hypothesis"]
dev = ["ruff"]

[tool.pytest.ini_options]
testpaths = ["tests"]
addopts = "-x --cov=ranges --import-mode=importlib -p no:warnings -n 4 --deselect tests/test_r.py::test_slow"
"""


def test_a_pyproject_project_with_a_test_extra(tmp_path):
    tree = make(tmp_path, {"pyproject.toml": PYPROJECT, "src/ranges/__init__.py": "", "tests/test_r.py": "",
                           "tests/conftest.py": "", "examples/test_demo.py": ""})
    project = detect(tree)
    assert (project.name, project.version, project.python_requires) == ("ranges", "1.2.0", ">=3.9")
    assert project.installable and project.extras == ("test",) and project.requirement_files == ()
    assert project.requires == ("attrs",)
    assert project.install == ((*PIP, "-e", ".[test]"),)  # pytest is in the extra: not added again
    assert project.evidence == ("pyproject.toml [tool.pytest.ini_options]", "conftest.py",
                                "pytest in the test requirements", "test files")
    assert project.pytest_config == "pyproject.toml" and project.test_paths == ("tests",)  # testpaths, not examples/
    assert project.addopts == ("--import-mode=importlib", "-p", "no:warnings", "--deselect", "tests/test_r.py::test_slow")


def test_setup_py_is_read_for_literals_and_never_run(tmp_path):
    setup = """\
import os
from setuptools import setup
open(os.path.join(os.path.dirname(__file__), "RAN"), "w").close()
REQUIRES = ["requests>=2", "idna"]

def version():
    helper.setup()  # another `setup` call: the one with setup's keywords counts
    return "9.9"

setup(name="legacy", version=version(), install_requires=REQUIRES, python_requires=">=3.8",
      extras_require={"testing": ["pytest", "mock"], "dev": ["black"]})
"""
    tree = make(tmp_path, {"setup.py": setup, "legacy/__init__.py": "", "legacy/tests/test_core.py": "",
                           "test_top.py": "", "pkg/test_inline.py": ""})
    project = detect(tree)
    assert not (tree / "RAN").exists()
    assert (project.name, project.version, project.python_requires) == ("legacy", None, ">=3.8")
    assert project.requires == ("requests>=2", "idna")  # a module-level name bound to a literal
    assert project.extras == ("testing",) and project.install == ((*PIP, "-e", ".[testing]"),)
    assert project.evidence == ("pytest in the test requirements", "test files") and project.pytest_config is None
    assert project.test_paths == ("legacy/tests", "pkg/test_inline.py", "test_top.py")


def test_setup_cfg_with_a_bare_pyproject_and_its_own_test_files_pattern(tmp_path):
    cfg = """\
[metadata]
name = declarative
version = attr: declarative.__version__

[options]
python_requires = >=3.10
install_requires =
    click

[options.extras_require]
tests =
    pytest-mock

[tool:pytest]
python_files = check_*.py
"""
    tree = make(tmp_path, {"setup.cfg": cfg, "pyproject.toml": "[tool.black]\nline-length = 99\n",
                           "declarative/__init__.py": "", "testing/check_a.py": "", "testing/test_ignored.txt": ""})
    project = detect(tree)
    assert (project.name, project.version, project.python_requires) == ("declarative", None, ">=3.10")
    assert project.requires == ("click",)
    assert project.installable and project.extras == ("tests",)
    assert project.install == ((*PIP, "-e", ".[tests]", "pytest"),)  # pytest-mock is not pytest
    assert project.evidence[0] == "setup.cfg [tool:pytest]" and project.test_paths == ("testing",)
    cfg_only = detect(make(tmp_path / "cfg_only", {"setup.cfg": cfg, "m.py": "", "check_m.py": ""}))
    assert not cfg_only.installable and cfg_only.name == "declarative"  # pip needs a setup.py or a pyproject.toml


def test_requirement_files_without_packaging(tmp_path):
    tree = make(tmp_path, {"app.py": "", "requirements.txt": "flask==3.0\n",
                           "requirements-test.txt": "-r requirements.txt\n# tools\npytest==8.3 # pinned\n",
                           "requirements-docs.txt": "sphinx\n", "dev-requirements.txt": "ruff\n",
                           "tests/test_app.py": "", "pytest.ini": "[pytest]\n"})
    project = detect(tree)
    assert not project.installable and project.name is None
    assert project.requirement_files == ("requirements.txt", "requirements-test.txt")  # dev only without test files
    assert project.install == ((*PIP, "-r", "requirements.txt", "-r", "requirements-test.txt"),)
    assert project.evidence[0] == "pytest.ini [pytest]"
    nested = make(tmp_path / "nested", {"app.py": "", "requirements/base.txt": "attrs\n",
                                        "requirements/testing.txt": "-r base.txt\n", "requirements/lint.txt": "",
                                        "tests/test_app.py": "", "tox.ini": "[tox]\nenvlist = py\n[pytest]\n"})
    project = detect(nested)
    assert project.install == ((*PIP, "-r", "requirements/base.txt", "-r", "requirements/testing.txt", "pytest"),)
    assert project.evidence[0] == "tox.ini [pytest]"


def test_dependency_groups_and_the_dev_fallback(tmp_path):
    pyproject = """\
[project]
name = "grouped"
dynamic = ["version"]
optional-dependencies = {dev = ["pytest"]}

[dependency-groups]
test = ["pytest>=8", {include-group = "typing"}, "--index-url=http://elsewhere"]
typing = ["mypy", {include-group = "test"}]
dev = ["ipython"]
"""
    project = detect(make(tmp_path, {"pyproject.toml": pyproject, "grouped.py": "", "tests/test_g.py": ""}))
    assert project.version is None and project.extras == ("dev",)  # no test extra: `dev`
    assert project.install == ((*PIP, "-e", ".[dev]", "pytest>=8", "mypy"),)  # test group, never an option


def test_the_walk_skips_what_pytest_skips(tmp_path):
    tree = make(tmp_path, {"pkg/__init__.py": "", "tests/unit/test_a.py": "", "tests/integration/test_b.py": "",
                           ".venv/lib/test_x.py": "", "env/pyvenv.cfg": "", "env/lib/test_y.py": "",
                           "build/lib/pkg/tests/test_a.py": "", "node_modules/x/test_z.py": "",
                           "pkg.egg-info/test_w.py": "", "src/pkg/tests/test_c.py": "", "pkg/core_test.py": "",
                           os.fsdecode(b"odd/test_caf\xe9.py"): ""})  # a name that is not UTF-8 is a path too
    assert detect(tree).test_paths == ("odd/test_caf\udce9.py", "pkg/core_test.py", "src/pkg/tests", "tests")


def test_testpaths_globs_and_native_toml_config(tmp_path):
    tree = make(tmp_path, {"pytest.toml": '[pytest]\ntestpaths = ["suites/*"]\naddopts = ["-ra", "-m", "not net"]\n',
                           "pkg.py": "", "suites/a/test_1.py": "", "suites/b/test_2.py": "", "tests/test_other.py": ""})
    project = detect(tree)
    assert project.test_paths == ("suites/a", "suites/b") and project.addopts == ("-m", "not net")
    assert project.evidence[0] == "pytest.toml [pytest]"


def test_kept_addopts_keeps_what_selects_and_imports():
    opts = ["-x", "--cov", "pkg", "-pno:cacheprovider", "--ignore", "tests/net", "--ignore-glob=*_slow.py", "-Werror",
            "--doctest-modules", "--maxfail=2", "--lf", "-q", "-m", "not slow", "--import-mode", "append"]
    assert kept_addopts(opts) == ("-pno:cacheprovider", "--ignore", "tests/net", "--ignore-glob=*_slow.py", "-Werror",
                                  "--doctest-modules", "-m", "not slow", "--import-mode", "append")


@pytest.mark.parametrize("files, words", [
    ({"README.md": "# no code\n", "tests/test_x.txt": ""}, "no Python"),
    ({"pkg/__init__.py": "", "pkg/core.py": "", "tests/conftest.py": ""}, "no tests"),
    ({"pkg.py": "", "pyproject.toml": '[tool.pytest.ini_options]\ntestpaths = ["tests"]\n', "tests/data.py": "",
      "other/test_x.py": ""}, "no tests: no file matching test_.*under testpaths"),
])
def test_trees_with_no_python_or_no_tests_are_named(tmp_path, files, words):
    with pytest.raises(ProjectError, match=words):
        detect(make(tmp_path, files))


@pytest.mark.parametrize("name, text, line", [
    ("pyproject.toml", '[project]\nname = "x"\nversion = 1.2.3\n', 3),
    ("pyproject.toml", b'[project]\nname = "caf\xe9"\n', None),
    ("setup.py", "from setuptools import setup\nsetup(name='x',\n", 2),
    ("setup.cfg", "name = orphan\n[metadata]\n", 1),
    ("tox.ini", "[pytest]\naddopts = -x\n  continued\n[pytest\n", 4),
    ("pytest.ini", '[pytest]\naddopts = "-x\n', None),
])
def test_files_that_do_not_parse_name_the_file_and_line(tmp_path, name, text, line):
    tree = make(tmp_path, {name: text, "pkg.py": "", "tests/test_x.py": ""})
    with pytest.raises(ProjectError) as caught:
        detect(tree)
    assert caught.value.path == str(tree / name) and caught.value.line == line
    assert str(caught.value).startswith(f"{tree / name}:{line}:" if line else f"{tree / name}:")


def test_overrides_replace_what_is_detected(tmp_path):
    tree = make(tmp_path, {"pkg.py": "", "checks/verify.py": "", "tests/test_x.py": ""})
    project = detect(tree, {"test_command": "python -m pytest -p xdist -n 2", "install": ["make deps", ["pip", "x"]],
                            "test_paths": ["checks", "tests/*.py"]})
    assert project.test_command == ("python", "-m", "pytest", "-p", "xdist", "-n", "2")
    assert project.install == (("make", "deps"), ("pip", "x")) and project.test_paths == ("checks", "tests/test_x.py")
    assert test_command(project, "/r.xml", None) == [*project.test_command, "--junitxml=/r.xml", "checks",
                                                     "tests/test_x.py"]
    assert detect(make(tmp_path / "only_checks", {"pkg.py": "", "checks/verify.py": ""}),
                  {"test_paths": "checks", "install": []}).install == ()
    with pytest.raises(ProjectError, match=r"unknown keys \['image', 'test_cmd'\]"):
        detect(tree, {"test_cmd": "pytest", "image": "x"})
    with pytest.raises(ProjectError, match=r"test_paths \['nowhere'\] match nothing"):
        detect(tree, {"test_paths": ["nowhere", "checks"]})
    for bad in ({"test_command": []}, {"install": 3}, {"test_paths": [""]}, {"install": ["pip install 'x"]}):
        with pytest.raises(ProjectError, match=next(iter(bad))):
            detect(tree, bad)


def test_test_command_selects_node_ids_and_overrides_addopts(tmp_path):
    project = detect(make(tmp_path, {"pyproject.toml": PYPROJECT, "ranges.py": "", "tests/test_r.py": ""}))
    command = test_command(project, "out/report.xml", ["tests/test_r.py::test_a[1.5]"], python="/usr/bin/python3")
    assert command[:3] == ["/usr/bin/python3", "-m", "pytest"] and command[-1] == "tests/test_r.py::test_a[1.5]"
    for part in (["-o", "addopts="], ["-p", "no:cacheprovider"], ["--junitxml=out/report.xml"],
                 ["--continue-on-collection-errors"], ["--import-mode=importlib"]):
        assert any(command[i:i + len(part)] == part for i in range(len(command)))
    assert "--cov=ranges" not in command and "-x" not in command
    assert test_command(project, "r.xml", None)[-1] == "tests"
    with pytest.raises(ValueError, match="no node ids"):
        test_command(project, "r.xml", [])
    with pytest.raises(ValueError, match="not node ids"):
        test_command(project, "r.xml", ["tests/test_r.py::ok", "--junitxml=/elsewhere"])


def test_a_real_run_reports_node_ids_that_select_the_tests_again(tmp_path):
    """pytest really runs `test_command` (with a project whose addopts would stop at the first failure and need
    pytest-cov); its report parses to the node ids pytest prints, and those select exactly those tests."""
    suite = '''\
import pytest

def test_fails_first():
    assert 1 == 2

class TestCase:
    @pytest.mark.parametrize("v", ["1.5", "a[b]", "x::y"])
    def test_param(self, v):
        assert v

    class TestNested:
        def test_deep(self):
            pytest.skip("later")
'''
    tree = make(tmp_path, {"pyproject.toml": '[tool.pytest.ini_options]\naddopts = "-x --cov=mod"\n',
                           "mod.py": "", "tests/v1.2/test_suite.py": suite, "tests/test_broken.py": "import nope\n"})
    project = detect(tree)
    env = {**os.environ, **TEST_ENV, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}  # this venv's plugins only cost time

    def run(node_ids: list[str] | None) -> dict[str, str]:
        report = tmp_path / "report.xml"
        report.unlink(missing_ok=True)
        command = test_command(project, str(report), node_ids, python=sys.executable)
        proc = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode in (0, 1), proc.stdout[-2000:] + proc.stderr[-2000:]  # tests ran (some failed)
        return parse_junit(report.read_text())

    everything = run(None)
    base = "tests/v1.2/test_suite.py"
    assert everything == {"tests/test_broken.py": "error", f"{base}::test_fails_first": "failed",
                          f"{base}::TestCase::test_param[1.5]": "passed", f"{base}::TestCase::test_param[a[b]]": "passed",
                          f"{base}::TestCase::test_param[x::y]": "passed",
                          f"{base}::TestCase::TestNested::test_deep": "skipped"}
    chosen = [f"{base}::TestCase::test_param[a[b]]", f"{base}::TestCase::test_param[x::y]"]
    assert run(chosen) == dict.fromkeys(chosen, "passed")
    assert not (tree / ".pytest_cache").exists()


def test_deselected_tests_are_left_out_of_every_run_and_a_bad_entry_is_named(tmp_path):
    """`project.deselect` (a slow test the probe would pay for on every run): pytest really leaves it out of the
    whole suite and of a selection naming it, with the detected command and with a `test_command` override."""
    tree = make(tmp_path, {"mod.py": "", "tests/test_s.py": "def test_slow():\n    pass\n\n\n"
                                                             "class TestK:\n    def test_fast(self):\n        pass\n"})
    env = {**os.environ, **TEST_ENV, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    for override in ({"deselect": "tests/test_s.py::test_slow"},
                     {"deselect": ["tests/test_s.py::test_slow"],
                      "test_command": [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o",
                                       "junit_family=xunit1"]}):
        project = detect(tree, override)
        assert project.deselect == ("tests/test_s.py::test_slow",)
        for selection in (None, ["tests/test_s.py::test_slow", "tests/test_s.py::TestK::test_fast"]):
            report = tmp_path / "report.xml"
            report.unlink(missing_ok=True)
            command = test_command(project, str(report), selection, python=sys.executable)
            proc = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, timeout=120)
            assert proc.returncode == 0, proc.stdout[-2000:]
            assert parse_junit(report.read_text()) == {"tests/test_s.py::TestK::test_fast": "passed"}
    for bad in ({"deselect": []}, {"deselect": ["--collect-only"]}, {"deselect": [3]}):
        with pytest.raises(ProjectError, match="deselect"):
            detect(tree, bad)


def test_links_leading_out_of_the_tree_are_never_read(tmp_path):
    outside = make(tmp_path / "host", {"secret.txt": "leaked-package==1\n", "pyproject.toml": "[project\n"})
    tree = make(tmp_path / "tree", {"pkg/__init__.py": "", "tests/test_a.py": "def test_a():\n    pass\n",
                                    "requirements/base.txt": "inside==1\n"})
    (tree / "requirements.txt").symlink_to(outside / "secret.txt")
    (tree / "requirements" / "test.txt").symlink_to("../../host/secret.txt")
    (tree / "pyproject.toml").symlink_to(outside / "pyproject.toml")  # would not parse if it were read
    (tree / "loop.txt").symlink_to(tree / "loop.txt")
    (tree / "tests" / "test_b.py").symlink_to(tree / "tests" / "test_a.py")  # inside: still a file of the tree
    project = detect(tree)
    assert project.requirement_files == ("requirements/base.txt",)
    assert all("secret" not in " ".join(c) for c in project.install)
    assert project.install == ((*PIP, "-r", "requirements/base.txt", "pytest"),)
