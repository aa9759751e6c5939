"""The repository source without Docker (tasks/envs/repos: plan, image, grade, make's pieces, config): what a build
plans from a small git repository, what its image holds (never a test file), the grader's runs on the host, and the
config's errors naming the bad field."""

from __future__ import annotations

import json
import sys

import pytest
from helpers import small_config
from repos_kit import calc_repo

from trajforge.schemas.config import ConfigError, RepoSourceConfig, parse_config
from trajforge.tasks.envs.repos import grade
from trajforge.tasks.envs.repos.history import checkout, open_repository
from trajforge.tasks.envs.repos.image import recipe, requirements, split
from trajforge.tasks.envs.repos.make import REPORT, hidden_tests, instruction, solution
from trajforge.tasks.envs.repos.plan import items
from trajforge.tasks.envs.repos.project import detect, test_command
from trajforge.tasks.sandbox import SandboxError

PIP = b"not really a wheel"


def test_plan_is_deterministic_deduplicated_and_capped(tmp_path):
    shas = calc_repo(tmp_path / "calc")
    cfg = RepoSourceConfig(path=str(tmp_path / "calc"), commits=5, bugs=6, seed=3)
    first, skipped = items(0, cfg)
    assert first == items(0, cfg)[0]  # the same repository, config and seed: the same items
    commits = [i["sha"] for i in first if i["task"] == "commit"]
    assert commits == [shas["sub"], shas["refactor"]] and skipped == {"commit_root_commit": 1}
    bugs = [i for i in first if i["task"] == "planted_bug"]
    assert len(bugs) == 6 and all(i["rev"] == shas["refactor"] and len(i["plants"]) == 1 for i in bugs)
    assert len({json.dumps(i["plants"]) for i in bugs}) == 6
    other = items(0, cfg.model_copy(update={"seed": 4}))[0]
    assert [i for i in other if i["task"] == "planted_bug"] != bugs  # another seed, another sample
    capped, why = items(0, cfg.model_copy(update={"max_per_repo": 3}))
    assert capped == first[:3] and why["over_cap"] == len(first) - 3
    pairs = items(0, cfg.model_copy(update={"bugs": 2, "bugs_per_task": 2, "commits": 0}))[0]
    assert [len(i["plants"]) for i in pairs] == [2, 2]


def test_the_image_holds_the_code_and_never_a_test_file(tmp_path):
    shas = calc_repo(tmp_path / "calc", extra={"requirements.txt": "calc\n-e .\nrequests>=2\n./local\n",
                                               "data/logo.bin": "\x00\x01"})
    tree = checkout(open_repository(tmp_path / "calc"), shas["init"], tmp_path / "tree")
    (tree / "data" / "logo.bin").write_bytes(b"\x00\x01\xff")
    code, tests = split(tree)
    assert sorted(tests) == ["tests/test_calc.py"] and "calc/__init__.py" in code
    project = detect(tree)
    assert requirements(project, tree) == ["requests>=2"]  # not the project itself, nor a path
    dockerfile, context, blobs = recipe("trajforge/base:latest", "/home/agent/work", project, tree, code, PIP,
                                        "pip-1-py3-none-any.whl", False)
    assert not any("test" in f.path for f in context) and not any("test_calc" in f.content for f in context)
    assert [b.path for b in blobs] == [".tf-pip/pip-1-py3-none-any.whl", "project/data/logo.bin"]
    assert "-r /opt/trajforge/requirements.txt" in dockerfile and "COPY project/ /home/agent/work/" in dockerfile
    assert "/home/agent/work > /usr/lib/python3/dist-packages/zz-trajforge-project.pth" in dockerfile
    finder = next(f.content for f in context if f.path == ".tf-project-first.py")
    assert "NAMES = frozenset(['calc'])" in finder and "ROOT = '/home/agent/work'" in finder
    none = recipe("b", "/w", detect(tree, {"install": []}), tree, code, PIP, "pip.whl", True)[0]
    assert "requirements.txt\n" not in none.split("COPY project/")[1] and "pip.whl/pip install" not in none


def test_the_grader_runs_the_suite_and_the_lists_on_the_host(tmp_path, monkeypatch):
    shas = calc_repo(tmp_path / "calc")
    tree = checkout(open_repository(tmp_path / "calc"), shas["sub"], tmp_path / "tree")
    project = detect(tree)
    spec = {"command": test_command(project, REPORT, ["x"], python=sys.executable)[:-1],
            "paths": list(project.test_paths), "timeout_s": 60, "fail_to_pass": ["tests/test_calc.py::test_sub"],
            "pass_to_pass": ["tests/test_calc.py::test_add"], "workdir": str(tree)}
    here = tmp_path / "verifier"
    for f in hidden_tests(split(tree)[1], spec, "/w"):  # the test files in `tree/`, the code where it is
        (here / f.path).parent.mkdir(parents=True, exist_ok=True)
        (here / f.path).write_text(f.content)
    monkeypatch.syspath_prepend(str(tree))  # the image's .pth: the code importable from anywhere
    monkeypatch.setattr(grade, "HERE", str(here))
    monkeypatch.setattr(grade, "REWARD", str(tmp_path / "logs" / "reward.json"))
    monkeypatch.setenv("PYTHONPATH", str(tree))
    monkeypatch.syspath_prepend(str(here))
    assert grade.main("outcomes") == 0
    assert grade.main("reward") == 0
    reward = json.loads((tmp_path / "logs" / "reward.json").read_text())
    assert reward["reward"] == 1.0 and [t["name"] for t in reward["tests"]] == spec["fail_to_pass"] + spec["pass_to_pass"]
    (tree / "calc" / "__init__.py").write_text((tree / "calc" / "__init__.py").read_text().replace("a - b", "b - a"))
    assert grade.main("reward") == 1
    reward = json.loads((tmp_path / "logs" / "reward.json").read_text())
    assert reward["reward"] == 0.0 and reward["tests"][0]["message"].startswith("failed: ")
    # the red team's plugin: a dist-info the agent adds to the work dir declares a [pytest11] entry point whose
    # module turns every test into a pass; the grader loads plugins only from outside the work dir
    (tree / "evil_pass.py").write_text("def pytest_collection_modifyitems(items):\n"
                                       "    for item in items:\n        item.runtest = lambda: None\n")
    (tree / "evil_pass-1.0.dist-info").mkdir()
    (tree / "evil_pass-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: evil-pass\nVersion: 1.0\n")
    (tree / "evil_pass-1.0.dist-info" / "entry_points.txt").write_text("[pytest11]\nevil = evil_pass\n")
    assert "evil_pass" not in grade._trusted_plugins(str(tree)) and "evil_pass" in grade._trusted_plugins(None)
    assert grade.main("reward") == 1
    assert json.loads((tmp_path / "logs" / "reward.json").read_text())["reward"] == 0.0


def test_solution_and_instruction_name_no_test_code():
    patch = "diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n"
    [cmd] = solution(patch)
    assert cmd.startswith("git apply --whitespace=nowarn - <<'TF_PATCH_") and patch.rstrip() in cmd
    text = instruction({"kind": "commit", "subject": "Add sub", "body": "", "files": ["calc/__init__.py"]}, "calc",
                       "/w", "- `tests/test_calc.py::test_sub`: ImportError: cannot import name 'sub'")
    assert "Add sub" in text and "calc/__init__.py" in text and "test_sub" in text and "assert" not in text


@pytest.mark.parametrize("repo, field", [
    ({"pypi": "x"}, "versions"), ({}, "exactly one"), ({"path": "p", "project": {"instal": []}}, "instal"),
    ({"path": "p", "bugs_per_task": 9}, "bugs_per_task"), ({"path": "p", "versions": ["1"]}, "pypi")])
def test_a_bad_repository_config_names_the_field(repo, field):
    with pytest.raises(ConfigError) as err:
        parse_config({"dataset": "d", "synthesize": {"repos": [repo]}})
    assert "synthesize.repos.0" in str(err.value) and field in str(err.value)


def test_a_folder_that_is_no_repository_is_one_commit_of_history(tmp_path, monkeypatch):
    from trajforge.tasks.envs.repos.fetch import SourceError, repository_path

    monkeypatch.setenv("TRAJFORGE_CACHE", str(tmp_path / "cache"))
    (tmp_path / "proj" / "calc").mkdir(parents=True)
    (tmp_path / "proj" / "calc" / "__init__.py").write_text("def f():\n    return 1 < 2\n")
    path = repository_path(str(tmp_path / "proj"), None, [])
    assert path == repository_path(str(tmp_path / "proj"), None, [])  # cached by content
    assert open_repository(path).head is not None
    with pytest.raises(SourceError, match="not a folder"):
        repository_path(str(tmp_path / "nowhere"), None, [])


def test_offline_reads_the_cache_and_never_downloads(tmp_path, monkeypatch):
    """`TRAJFORGE_OFFLINE=1` (benchmarks, offline builds): a source not in the cache is a named error saying how to
    fetch it; nothing is downloaded or cloned (pip and git are never started)."""
    import subprocess

    from trajforge.tasks.envs.repos import fetch

    monkeypatch.setenv("TRAJFORGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("TRAJFORGE_OFFLINE", "1")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail(f"started {a[0]!r} offline"))
    for path, pypi in ((None, "more-itertools"), ("https://example.invalid/x.git", None)):
        with pytest.raises(fetch.SourceError, match=r"not in the cache .*trajforge envs fetch CONFIG"):
            fetch.repository_path(path, pypi, ["9.0.0"])


def test_a_commit_task_states_the_interface_and_the_notes_never_a_body():
    """The instruction of a commit task carries what the change adds or alters (signatures and docstrings of public
    definitions, as its own documentation states them) and the changelog lines it adds; never a function's body,
    never a private name, nothing unchanged."""
    from trajforge.tasks.envs.repos.api import change_notes, interface

    before = {"pkg/m.py": b'def kept(x):\n    """Same."""\n    return 1\n\n\ndef changed(x):\n    """Old."""\n'}
    after = {"pkg/m.py": b'def kept(x):\n    """Same."""\n    return 2\n\n\ndef changed(x, y=0):\n    """Old."""\n\n\n'
                         b'def added(*its, n: int = 1) -> list:\n    """Like product.\n\n    >>> added(\'AB\')\n    [1]\n'
                         b'    """\n    return SECRET_BODY\n\n\ndef _private():\n    pass\n\n\nclass Thing(Base):\n    pass\n',
             "pkg/new.py": b"def fresh():\n    pass\n", "pkg/broken.py": b"def (:\n"}
    text = interface(before, after)
    assert "def changed(x, y=0):" in text and "def added(*its, n: int=1) -> list:" in text
    assert "    >>> added('AB')\n    [1]" in text and "class Thing(Base):\n    ..." in text
    assert "# new in pkg/new.py\ndef fresh():\n    ..." in text
    assert text.index("def added") < text.index("def fresh") < text.index("# changed in pkg/m.py\ndef changed")
    assert "kept" not in text and "_private" not in text and "SECRET_BODY" not in text and "broken" not in text
    assert interface(before, before) == ""
    diff = ("diff --git a/docs/versions.rst b/docs/versions.rst\n--- a/docs/versions.rst\n+++ b/docs/versions.rst\n"
            "@@ -1 +1,3 @@\n+1.1\n+* New: added\n old\n"
            "diff --git a/pkg/m.py b/pkg/m.py\n--- a/pkg/m.py\n+++ b/pkg/m.py\n@@ -1 +1 @@\n+CODE = 1\n")
    assert change_notes(diff) == "1.1\n* New: added"
    sub = instruction({"kind": "commit", "subject": "Add added", "body": "", "files": ["pkg/m.py"],
                       "notes": change_notes(diff), "interface": text}, "pkg", "/w", "- `t::x`: boom")
    assert "change notes for it:\n\n1.1\n* New: added" in sub and "```python\n# new in pkg/m.py\n" in sub


ISSUE = ("`gray_product` is missing\n\nI would like an iterator like itertools.product whose consecutive tuples differ "
         "in one element only, e.g. for testing switch settings in the fewest flips.")
PATCH = "diff --git a/pkg/m.py b/pkg/m.py\n+++ b/pkg/m.py\n+def gray_product(*iterables):\n+    return _gray_walk(iterables)\n"
HIDDEN = {"tests/test_m.py": b"from pkg import gray_product\n\ndef test_gray():\n    assert list(gray_product('AB', 'CD'))[:2] "
                             b"== [('A', 'C'), ('B', 'C')]\n"}
CODE = {"pkg/__init__.py": b"from pkg import gray_product\n"}


@pytest.mark.parametrize("reply,written", [
    (ISSUE, "written"),
    (ISSUE + "\n\nAs the docs say:\n\n    def gray_product(*iterables):", "written"),  # shown to it: not a copy
    (ISSUE + "\n\nFix: `return _gray_walk(iterables)`", "reference solution"),
    (ISSUE + "\n\n    assert list(gray_product('AB', 'CD'))[:2] == [('A', 'C'), ('B', 'C')]", "hidden tests"),
    ("Please fix.", "characters"),
])
def test_the_teacher_writes_the_issue_text_and_copies_are_refused(tmp_path, reply, written):
    """`issue_text: teacher`: the teacher reads the change (message, notes, interface, failing tests) but never the
    diff's body or a test file; a reply copying a line of the solution or of the hidden tests, or of no useful
    length, is not used (the commit-written instruction stays, the reason recorded); a teacher that fails is the
    same fallback."""
    from fake_openai import FakeOpenAI

    from trajforge.tasks.envs.repos.issue import write_issue
    from trajforge.tasks.teachers import make_teacher

    task = {"kind": "commit", "subject": "9.1.0", "body": "", "files": ["pkg/m.py"], "notes": "* New: gray_product",
            "interface": "def gray_product(*iterables):\n    ..."}  # (the patch adds that line: shown, not a copy)
    failing = "- `tests/test_m.py::test_gray`: AttributeError: no attribute 'gray_product'"
    with FakeOpenAI("ok", lambda req, n: {"role": "assistant", "content": reply}) as srv:
        teacher = parse_config(small_config(tmp_path, teacher={"backend": "openai", "endpoints": [srv.url],
                                                               "model": "fake", "tool_calling": False})).teacher
        text, why = write_issue(lambda: make_teacher(teacher), task, "pkg", failing, PATCH, HIDDEN, CODE)
        [body] = srv.bodies
    asked = json.dumps(body["messages"])
    assert "gray_product" in asked and "test_gray" in asked and "New: gray_product" in asked
    assert "_gray_walk" not in asked and "[('A', 'C')" not in asked  # neither the diff's body nor the tests' code
    assert text == (reply if written == "written" else None) and written in why, why
    with FakeOpenAI("500") as srv:
        down = parse_config(small_config(tmp_path, teacher={"backend": "openai", "endpoints": [srv.url], "model": "fake",
                                                            "tool_calling": False, "retries": 0})).teacher
        text, why = write_issue(lambda: make_teacher(down), task, "pkg", failing, PATCH, HIDDEN, CODE)
    assert text is None and why.startswith("teacher_error"), why


def test_a_commit_reference_is_the_project_code_only(tmp_path):
    """A release's diff carries docs, CI and metadata: the reference solution keeps the files of the project's
    packages (package data too) and its top-level modules, never `docs/conf.py`, a Makefile or `setup.py` (the test
    audit's emptied mutant of such a file survives every test: a sound task rejected as weak)."""
    from trajforge.tasks.envs.repos.make import code_patch

    (tmp_path / "pkg").mkdir()
    for name in ("pkg/__init__.py", "setup.py", "mod.py", "docs/conf.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x = 1\n")
    block = "diff --git a/{0} b/{0}\n--- a/{0}\n+++ b/{0}\n@@ -1 +1 @@\n-x = 0\n+x = 1\n".format
    files = ["docs/conf.py", "Makefile", "PKG-INFO", "pkg/data.json", "pkg/__init__.py", "mod.py", "setup.py"]
    code = split(tmp_path)[0]
    kept = [line.split(" b/")[1] for line in code_patch("".join(block(f) for f in files), code).splitlines()
            if line.startswith("diff --git")]
    assert kept == ["pkg/data.json", "pkg/__init__.py", "mod.py"]
    assert code_patch(block("docs/conf.py"), code) == ""


def test_the_host_digest_of_a_restored_file_is_the_sandbox_checksum(tmp_path):
    """A planted bug's probe compares the files its inverse patch gives back (the sandbox's checksum script, run as
    root) with `file_digest` of the revision's bytes, computed on the host: the two agree on plain, empty and
    non-UTF-8 files, and on names the script would read as patterns; one byte off differs."""
    import glob
    import subprocess

    from trajforge.tasks.sandbox.checksums import digest_command, file_digest

    files = {"a.py": b"x = 1\n" * 1000, "empty.py": b"", "b[1].py": b"\xff\x00z"}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    run = subprocess.run(digest_command([glob.escape(n) for n in files]), shell=True, cwd=tmp_path,
                         capture_output=True, text=True, check=True)
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got == {name: file_digest(data) for name, data in files.items()}
    assert file_digest(b"x = 1\n" * 1000) != file_digest(b"x = 2\n" + b"x = 1\n" * 999)


def test_a_hang_is_judged_against_the_solved_states_own_suite_time():
    """A busy machine slows the solved state's suite as much as the starting state's: a timeout counts as a hang
    only when it is far past the solved state's own time; too close to tell is infrastructure, never a reject."""
    from trajforge.tasks.envs.repos.probe import HANG_FLOOR_S, Run, SuiteTooSlow, check_hang, hang_budget

    assert hang_budget(0.5, 120) == HANG_FLOOR_S and hang_budget(4, 120) == 40 and hang_budget(30, 120) == 120
    timed_out = Run(error="timed out", seconds=121, budget_s=120)
    check_hang(timed_out, [Run(seconds=3.0), Run(seconds=3.4)], 120)  # 120 s is past 10x 3.4 s: a hang
    check_hang(Run(seconds=50), [Run(seconds=20)], 120)  # no timeout: nothing to judge
    with pytest.raises(SuiteTooSlow, match="test_timeout_s=120s and the solved state's own took 20s"):
        check_hang(timed_out, [Run(seconds=3.0), Run(seconds=20.0)], 120)
    assert issubclass(SuiteTooSlow, SandboxError)  # a stage's shard fails and runs again: never a final reject
