"""Commits as task candidates (tasks/envs/repos/history.py): tiny git repositories built here, each commit kind
kept or skipped with its reason, diffs that apply, exact checkouts that leave nothing behind on failure,
deterministic histories from released trees, and bad input as named errors."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from trajforge.tasks.envs.repos.history import (
    REASONS,
    Candidate,
    RepositoryError,
    Skipped,
    UnknownRevision,
    candidates,
    checkout,
    diff_key,
    is_test_path,
    open_repository,
    releases_as_history,
    scan,
)

ODD = os.fsdecode(b"caf\xe9.py")  # a file name that is not UTF-8


class Repo:
    """A git repository in a folder, its commits a minute apart (a fixed order, whatever the clock)."""

    def __init__(self, path: Path):
        self.path, self.clock = path, 0
        path.mkdir(parents=True, exist_ok=True)
        self.git("init", "-q", "-b", "main")

    def git(self, *args: str) -> str:
        self.clock += 1
        date = f"{1_700_000_000 + self.clock * 60} +0000"
        env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
        env.update(GIT_AUTHOR_NAME="Ada", GIT_AUTHOR_EMAIL="ada@example.invalid", GIT_COMMITTER_NAME="Ada",
                   GIT_COMMITTER_EMAIL="ada@example.invalid", GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date,
                   GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1")
        out = subprocess.run(["git", "-C", str(self.path), *args], env=env, capture_output=True)
        assert out.returncode == 0, out.stderr.decode()
        return out.stdout.decode("utf-8", "surrogateescape").strip()

    def commit(self, message: str, files: dict[str, str | bytes | None]) -> str:
        """Write (None: delete) the files, commit them all, return the commit's id."""
        for name, content in files.items():
            target = self.path / name
            if content is None:
                target.unlink()
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content if isinstance(content, bytes) else content.encode())
        self.git("add", "-A")
        self.git("commit", "-q", "-m", message)
        return self.git("rev-parse", "HEAD")

    def show(self, sha: str, path: str) -> bytes:
        return subprocess.run(["git", "-C", str(self.path), "show", f"{sha}:{path}"], capture_output=True,
                              check=True).stdout


CALC = "def add(a, b):\n    return a + b\n"
TEST = "from pkg.calc import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n"


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    """One history with every kind of commit; `shas` names them."""
    repo = Repo(tmp_path_factory.mktemp("history") / "project")
    shas = {}
    shas["root"] = repo.commit("start", {"pkg/__init__.py": "", "pkg/calc.py": CALC, "tests/test_calc.py": TEST,
                                         "README.md": "# calc\n"})
    shas["code_and_test"] = repo.commit("Add sub\n\nSubtraction, with its test.", {
        "pkg/calc.py": CALC + "\n\ndef sub(a, b):\n    return a - b\n",
        "tests/test_calc.py": TEST.replace("add\n", "add, sub\n") + "\n\ndef test_sub():\n    assert sub(3, 2) == 1\n"})
    shas["test_only"] = repo.commit("More tests", {"tests/test_more.py": "def test_truth():\n    assert True\n"})
    shas["code_only"] = repo.commit("Document add", {
        "pkg/calc.py": (repo.path / "pkg/calc.py").read_text().replace("b):\n", 'b):\n    """a + b"""\n', 1)})
    shas["docs_only"] = repo.commit("Readme", {"README.md": "# calc\n\nAdds numbers.\n"})
    shas["binary"] = repo.commit("Logo", {"pkg/logo.png": b"\x89PNG\0\0\x01\x02", "pkg/calc.py":
                                          (repo.path / "pkg/calc.py").read_text() + "\nLOGO = 'logo.png'\n",
                                          "tests/test_logo.py": "def test_logo():\n    pass\n"})
    shas["odd_name"] = repo.commit("Odd name", {ODD: "X = 1\n", "tests/test_odd.py": "def test_odd():\n    pass\n"})
    repo.git("mv", "pkg/calc.py", "pkg/arith.py")
    shas["rename"] = repo.commit("Rename calc to arith", {
        "pkg/arith.py": (repo.path / "pkg/arith.py").read_text() + "\nPI = 3\n",
        "tests/test_calc.py": (repo.path / "tests/test_calc.py").read_text().replace("pkg.calc", "pkg.arith")})
    (repo.path / "vendor/lib").mkdir(parents=True)  # an uninitialized submodule's empty folder
    repo.git("update-index", "--add", "--cacheinfo", f"160000,{shas['root']},vendor/lib")
    shas["submodule"] = repo.commit("Vendor lib", {})
    base = shas["submodule"]
    repo.git("checkout", "-q", "-b", "side")
    mul = {"pkg/arith.py": (repo.path / "pkg/arith.py").read_text() + "\n\ndef mul(a, b):\n    return a * b\n",
           "tests/test_mul.py": "from pkg.arith import mul\n\n\ndef test_mul():\n    assert mul(2, 3) == 6\n"}
    shas["side"] = repo.commit("Add mul", mul)
    repo.git("checkout", "-q", "main")
    assert repo.git("rev-parse", "HEAD") == base
    shas["shift"] = repo.commit("Header", {"pkg/arith.py": "# arithmetic\n# helpers\n"
                                           + (repo.path / "pkg/arith.py").read_text()})
    repo.git("cherry-pick", shas["side"])
    shas["picked"] = repo.git("rev-parse", "HEAD")
    repo.git("merge", "-q", "--no-ff", "-m", "Merge side", "side")
    shas["merge"] = repo.git("rev-parse", "HEAD")
    return repo, shas


def _by_sha(outcomes) -> dict[str, Candidate | Skipped]:
    return {o.sha: o for o in outcomes}


def test_every_commit_yields_one_outcome_oldest_first_with_a_known_reason(history):
    repo, shas = history
    outcomes = list(candidates(repo.path))
    assert [o.sha for o in outcomes] == repo.git("rev-list", "--reverse", "--date-order", "HEAD").split()
    assert [o.sha for o in outcomes] == list(shas.values())
    for o in outcomes:
        assert isinstance(o, Candidate) or o.reason in REASONS or o.kind == "duplicate_of"
    kept, skipped = scan(repo.path)
    assert [c.sha for c in kept] == [shas["code_and_test"], shas["rename"], shas["side"]]
    assert {s.sha: s.reason for s in skipped} == {
        shas["root"]: "root_commit", shas["test_only"]: "no_code_change", shas["code_only"]: "no_test_change",
        shas["docs_only"]: "non_python_only", shas["binary"]: "binary_change", shas["odd_name"]: "non_utf8",
        shas["submodule"]: "submodule_change", shas["shift"]: "no_test_change",
        shas["picked"]: f"duplicate_of:{shas['side']}", shas["merge"]: "merge"}


def test_a_code_and_test_change_is_a_candidate_with_both_diffs(history):
    repo, shas = history
    c = _by_sha(candidates(repo.path))[shas["code_and_test"]]
    assert isinstance(c, Candidate)
    assert (c.parent, c.subject, c.body) == (shas["root"], "Add sub", "Subtraction, with its test.")
    assert c.author_date.startswith("2023-11-14T") and c.author_date.endswith("+00:00")
    assert [(f.path, f.status) for f in c.code_files] == [("pkg/calc.py", "M")]
    assert [(f.path, f.status) for f in c.test_files] == [("tests/test_calc.py", "M")]
    assert "+def sub(a, b):" in c.code_diff and "tests/" not in c.code_diff
    assert "+def test_sub():" in c.test_diff and "pkg/calc.py" not in c.test_diff
    assert (c.lines_added, c.lines_removed) == (4, 0)


def test_a_code_only_commit_is_a_candidate_when_tests_may_come_from_the_suite(history):
    repo, shas = history
    outcome = _by_sha(candidates(repo.path, require_test_change=False))[shas["code_only"]]
    assert isinstance(outcome, Candidate) and outcome.test_files == () and outcome.test_diff == ""
    assert '+    """a + b"""' in outcome.code_diff


def test_a_cap_on_code_lines_skips_larger_commits(history):
    repo, shas = history
    outcome = _by_sha(candidates(repo.path, max_code_lines=3))[shas["code_and_test"]]
    assert isinstance(outcome, Skipped) and outcome.reason == "too_large" and "4 code lines" in outcome.detail


def test_a_rename_keeps_both_names_and_a_cherry_pick_is_a_duplicate(history):
    repo, shas = history
    outcomes = _by_sha(candidates(repo.path))
    renamed = outcomes[shas["rename"]]
    assert [(f.path, f.status, f.old_path) for f in renamed.code_files] == [("pkg/arith.py", "R", "pkg/calc.py")]
    assert "rename from pkg/calc.py" in renamed.code_diff
    side, picked = outcomes[shas["side"]], outcomes[shas["picked"]]
    assert picked.reason == f"duplicate_of:{shas['side']}"
    # the pick applies elsewhere (other blob ids, other line numbers): the same change all the same
    picked_diff = subprocess.run(["git", "-C", str(repo.path), "diff", shas["shift"], shas["picked"], "--",
                                  "pkg/arith.py"], capture_output=True, check=True).stdout.decode()
    assert picked_diff.split("@@")[1] != side.code_diff.split("@@")[1]
    assert diff_key(picked_diff) == diff_key(side.code_diff)


def test_the_code_diff_applies_to_the_parent_tree_and_gives_the_commit_code_files(history, tmp_path):
    repo, shas = history
    for c in scan(repo.path)[0]:
        tree = checkout(repo.path, c.parent, tmp_path / c.sha)
        subprocess.run(["git", "apply", "-"], cwd=tree, input=c.code_diff.encode(), check=True, capture_output=True)
        for f in c.code_files:
            assert (tree / f.path).read_bytes() == repo.show(c.sha, f.path)
            if f.old_path:
                assert not (tree / f.old_path).exists()
        for f in c.test_files:  # the tests are not part of the solution
            assert not (tree / f.path).exists() or (tree / f.path).read_bytes() != repo.show(c.sha, f.path)


def test_range_count_and_paths_select_the_commits(history):
    repo, shas = history
    assert [o.sha for o in candidates(repo.path, max_count=2)] == [shas["picked"], shas["merge"]]
    assert [o.sha for o in candidates(repo.path, f"{shas['code_only']}..{shas['odd_name']}")] == \
        [shas["docs_only"], shas["binary"], shas["odd_name"]]
    assert [o.sha for o in candidates(repo.path, paths=["README.md"])] == [shas["root"], shas["docs_only"]]
    assert list(candidates(repo.path, max_count=0)) == []


def test_an_unknown_revision_or_range_is_a_named_error(history):
    repo, _ = history
    for bad in ("no-such-branch", "main..nowhere", "--output=/tmp/x", ""):
        with pytest.raises(UnknownRevision, match="revision"):
            list(candidates(repo.path, bad))


def test_a_bare_clone_gives_the_same_outcomes_and_lists_its_submodules(history, tmp_path):
    repo, shas = history
    subprocess.run(["git", "clone", "-q", "--bare", "--no-local", str(repo.path), str(tmp_path / "bare.git")],
                   check=True, capture_output=True, env={**os.environ, "GIT_CONFIG_GLOBAL": os.devnull})
    bare = open_repository(tmp_path / "bare.git")
    assert bare.bare and bare.head == shas["merge"] and bare.submodules == ("vendor/lib",)
    assert [(o.sha, type(o)) for o in candidates(bare)] == [(o.sha, type(o)) for o in candidates(repo.path)]
    assert open_repository(repo.path).submodules == ("vendor/lib",)


def test_the_callers_git_environment_does_not_redirect_git(history, tmp_path, monkeypatch):
    repo, shas = history
    other = Repo(tmp_path / "other")
    other.commit("other", {"x.py": "x = 1\n"})
    monkeypatch.setenv("GIT_DIR", str(other.path / ".git"))
    assert open_repository(repo.path).head == shas["merge"]


def test_the_usual_python_test_layouts_and_extra_globs():
    for path in ("tests/test_a.py", "pkg/tests/helpers.py", "test/data.json", "src/testing/x.py", "test_a.py",
                 "pkg/a_test.py", "conftest.py", "pkg/conftest.py"):
        assert is_test_path(path), path
    for path in ("pkg/a.py", "pkg/testsuite.py", "pkg/contest.py", "docs/tests.md", "pkg/test_data.txt"):
        assert not is_test_path(path), path
    assert is_test_path("spec/a.py", ["spec/*"]) and not is_test_path("spec/a.py")


def test_a_path_that_is_not_a_repository_is_a_named_error(history, tmp_path):
    repo, _ = history
    plain = tmp_path / "plain"
    plain.mkdir()
    (tmp_path / "file").write_text("x")
    for path in (plain, tmp_path / "missing", tmp_path / "file", repo.path / "pkg"):  # a folder inside one: no
        with pytest.raises(RepositoryError, match=str(path.name)):
            open_repository(path)
        with pytest.raises(RepositoryError, match=str(path.name)):
            list(candidates(path))


def test_a_diff_whose_text_is_not_utf8_is_skipped_with_its_reason(tmp_path):
    repo = Repo(tmp_path / "latin1")
    repo.commit("start", {"m.py": "# -*- coding: latin-1 -*-\nS = 'a'\n", "tests/test_m.py": ""})
    sha = repo.commit("accent", {"m.py": "# -*- coding: latin-1 -*-\nS = '\xe9'\n".encode("latin-1"),
                                 "tests/test_m.py": "def test_s():\n    pass\n"})
    skipped = scan(repo.path)[1]
    assert [(s.sha, s.reason, s.detail) for s in skipped][-1] == (sha, "non_utf8", "the diff's text is not UTF-8")


def test_an_empty_repository_has_no_commits_to_consider(tmp_path):
    empty = Repo(tmp_path / "empty")
    assert open_repository(empty.path).head is None
    assert scan(empty.path) == ([], [])


# -- checkout ---------------------------------------------------------------------------------------------------
@pytest.fixture
def tricky(tmp_path):
    """A tree that `git archive` with its own attributes would not reproduce: export-ignore, export-subst, an
    end-of-line rule; plus an executable, a symbolic link inside the tree and a non-UTF-8 name."""
    repo = Repo(tmp_path / "tricky")
    (repo.path / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (repo.path / "run.sh").chmod(0o755)
    (repo.path / "link.py").symlink_to("pkg/mod.py")
    sha = repo.commit("tricky", {".gitattributes": "secret.txt export-ignore\nversion.py export-subst\n"
                                                   "*.txt text eol=crlf\n",
                                 "secret.txt": "kept\n", "version.py": "V = '$Format:%H$'\n",
                                 "pkg/mod.py": "X = 1\n", ODD: "odd\n"})
    return repo, sha


def _tree(repo: Repo, sha: str) -> dict[str, tuple[str, bytes]]:
    out = subprocess.run(["git", "-C", str(repo.path), "ls-tree", "-r", "-z", sha], capture_output=True,
                         check=True).stdout
    entries = {}
    for entry in filter(None, out.split(b"\0")):
        meta, name = entry.split(b"\t", 1)
        mode, _, blob = meta.decode().split()
        content = subprocess.run(["git", "-C", str(repo.path), "cat-file", "blob", blob], capture_output=True,
                                 check=True).stdout
        entries[os.fsdecode(name)] = (mode, content)
    return entries


def _files(root: Path) -> dict[str, tuple[str, bytes]]:
    found = {}
    for path in root.rglob("*"):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            found[rel] = ("120000", os.fsencode(os.readlink(path)))
        elif path.is_file():
            found[rel] = ("100755" if path.stat().st_mode & stat.S_IXUSR else "100644", path.read_bytes())
    return found


def test_checkout_writes_the_exact_tree(tricky, tmp_path):
    repo, sha = tricky
    dest = checkout(repo.path, sha, tmp_path / "out")
    assert _files(dest) == _tree(repo, sha)
    assert (dest / "version.py").read_text() == "V = '$Format:%H$'\n" and (dest / "secret.txt").read_bytes() == b"kept\n"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _files(checkout(repo.path, "HEAD", empty)) == _tree(repo, sha)  # an empty folder is fine too
    for i in range(10):  # git pads its archive past tar's end marker: read whole, never a broken pipe
        checkout(repo.path, sha, tmp_path / f"again{i}")


def test_checkout_of_an_unknown_revision_or_into_a_used_folder_leaves_nothing(tricky, tmp_path):
    repo, _ = tricky
    with pytest.raises(UnknownRevision, match="nope"):
        checkout(repo.path, "nope", tmp_path / "out")
    used = tmp_path / "used"
    used.mkdir()
    (used / "keep").write_text("mine")
    with pytest.raises(RepositoryError, match="not an empty folder"):
        checkout(repo.path, "HEAD", used)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tricky", "used"] and (used / "keep").read_text() == "mine"


def test_checkout_failing_midway_leaves_nothing(tmp_path):
    repo = Repo(tmp_path / "escape")
    (repo.path / "out.py").symlink_to("../../../etc/passwd")  # a link out of the tree: refused by the filter
    sha = repo.commit("escape", {"a.py": "A = 1\n"})
    with pytest.raises(RepositoryError, match=sha):
        checkout(repo.path, sha, tmp_path / "dest")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["escape"]


# -- releases -------------------------------------------------------------------------------------------------------
def _release(root: Path, version: str, body: str, test: str) -> Path:
    tree = root / f"mod-{version}"
    for name, content in {"mod/__init__.py": "", "mod/core.py": body, "tests/test_core.py": test,
                          ".gitignore": "mod/_version.py\n", "mod/_version.py": f"VERSION = '{version}'\n"}.items():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text(content)
    return tree


def test_releases_as_history_is_deterministic_and_gives_candidates(tmp_path):
    v1 = _release(tmp_path, "1.0", "def f():\n    return 1\n", "def test_f():\n    pass\n")
    v2 = _release(tmp_path, "1.1", "def f():\n    return 2\n", "def test_f():\n    assert True\n")
    v3 = _release(tmp_path, "2.0", "def f():\n    return 3\n", "def test_f():\n    assert True\n")
    versions = [("1.0", v1), ("1.1", v2), ("2.0", v3)]
    a, b = releases_as_history(versions, tmp_path / "a"), releases_as_history(versions, tmp_path / "b")
    log = lambda repo: subprocess.run(["git", "-C", str(repo), "rev-list", "main"], capture_output=True,  # noqa: E731
                                      check=True).stdout.split()
    assert log(a) == log(b) and len(log(a)) == 3
    assert (a / "mod/_version.py").read_text() == "VERSION = '2.0'\n"  # ignored files are released files too
    kept, skipped = scan(a)
    assert [s.reason for s in skipped] == ["root_commit", "no_test_change"]
    assert [(c.subject, [f.path for f in c.code_files]) for c in kept] == [("1.1", ["mod/_version.py", "mod/core.py"])]
    assert [c.subject for c in scan(a, "1.1..2.0", require_test_change=False)[0]] == ["2.0"]


def test_releases_as_history_refuses_bad_input_and_leaves_nothing(tmp_path):
    tree = _release(tmp_path, "1.0", "X = 1\n", "")
    for versions, message in (([], "one or more"), ([("1.0", tree), ("1.0", tree)], "distinct"),
                              ([("bad..name", tree)], "not a valid tag"), ([("1.0", tmp_path / "gone")], "not a folder")):
        with pytest.raises(RepositoryError, match=message):
            releases_as_history(versions, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mod-1.0"]
