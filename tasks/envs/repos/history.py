"""Commits as task candidates (issue 43): the commits of a git repository that change non-test code, with the
tests they change, and the trees before and after them.

Invariants:
- git runs as an argument list, never through a shell: `git -C REPO ...` with `LC_ALL=C`, no prompt, and none
  of the caller's `GIT_*` variables (a `GIT_DIR` of the caller's never redirects it). Every diff is
  `--no-ext-diff --no-color --no-textconv`, text only (no `--binary`). Names are read from `-z` output and
  decoded with surrogateescape: no byte in a name crashes a scan.
- Every commit `candidates` considers yields exactly one `Candidate` or one `Skipped`, oldest first. A reason is
  one of `REASONS`, the first that applies in that order (a diff's text is read last: a `non_utf8` diff text
  comes after `too_large`), or `duplicate_of:<sha>`.
- A candidate's `code_diff` is the reference solution: `git diff PARENT COMMIT` of its non-test files only, UTF-8
  text that `git apply` applies to the parent's tree to give the commit's code files; `test_diff` is the same
  for its test files. Every changed file is in exactly one of the two.
- Two candidates whose code diffs are the same once blob ids, similarity scores and hunk positions are ignored
  (`diff_key`: a cherry-pick) are one: the first is kept, the later ones are `duplicate_of:<first sha>`.
- `checkout` writes the exact blobs of a commit's tree (no `.gitattributes` export or end-of-line rule is
  applied), through tarfile's `data` filter (no absolute path, no link out of the tree, no device).
- `checkout` and `releases_as_history` build in a temporary sibling of their destination and rename it at the
  end: after an error nothing is left at the destination, which must be absent or an empty folder.
- `releases_as_history` is deterministic: the same versions give the same commit ids (fixed identity and dates,
  no user or system git config read, no hook run).
- Bad input (not a repository, an unknown revision, a destination in use) raises `RepositoryError` naming the
  path or revision.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path, PurePosixPath

REASONS = ("merge", "root_commit", "submodule_change", "non_utf8", "no_code_change", "non_python_only",
           "binary_change", "no_test_change", "too_large")
"""Why a commit is not a candidate, in the order they are tested; `duplicate_of:<sha>` comes after all of them."""
TEST_DIRS = frozenset({"tests", "test", "testing"})
PYTHON_SUFFIXES = (".py",)
MAX_CODE_LINES = 500  # default cap on a candidate's changed code lines (added + removed)
MAX_FILES = 200  # changed files (code and test) beyond which a commit is `too_large` whatever its lines
GITLINK = b"160000"
DIFF_FLAGS = ("--no-ext-diff", "--no-color", "--no-textconv", "-M", "-U3", "--src-prefix=a/", "--dst-prefix=b/")
RELEASE_EPOCH = 946684800  # 2000-01-01T00:00:00Z: the first version's date, the next ones a day apart
RELEASE_IDENTITY = {"GIT_AUTHOR_NAME": "trajforge", "GIT_AUTHOR_EMAIL": "releases@trajforge.invalid",
                    "GIT_COMMITTER_NAME": "trajforge", "GIT_COMMITTER_EMAIL": "releases@trajforge.invalid"}


class RepositoryError(Exception):
    """A path that is not a usable repository, a destination in use, or a git command that failed."""


class UnknownRevision(RepositoryError):
    """A revision or range the repository does not have."""


@dataclass(frozen=True)
class Repository:
    path: Path  # what `git -C` is given: the top of the work tree, or the git directory when there is none
    git_dir: Path
    bare: bool  # no work tree at `path`
    head: str | None  # None before the first commit
    submodules: tuple[str, ...]  # gitlinks in HEAD's tree; a commit changing one is skipped (`submodule_change`)


@dataclass(frozen=True)
class ChangedFile:
    path: str
    status: str  # A, M, D, R (renamed from old_path), T (type changed: a file became a link or the reverse)
    old_path: str | None = None


@dataclass(frozen=True)
class Candidate:
    sha: str
    parent: str
    author_date: str  # ISO 8601
    subject: str
    body: str
    code_files: tuple[ChangedFile, ...]
    test_files: tuple[ChangedFile, ...]
    code_diff: str  # the reference solution
    test_diff: str
    lines_added: int  # in code files
    lines_removed: int


@dataclass(frozen=True)
class Skipped:
    sha: str
    reason: str  # one of REASONS, or duplicate_of:<sha>
    detail: str = ""

    @property
    def kind(self) -> str:
        """The reason without its argument (`duplicate_of`), for counting."""
        return self.reason.split(":", 1)[0]


# -- git ----------------------------------------------------------------------------------------------------------
def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(LC_ALL="C", GIT_TERMINAL_PROMPT="0", **extra)
    return env


def _run(where: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", "-C", str(where), *args], stdin=subprocess.DEVNULL, capture_output=True,
                              env=env or _env())
    except FileNotFoundError as e:
        raise RepositoryError("git is not installed") from e


def _tail(stderr: bytes) -> str:
    lines = [line for line in stderr.decode("utf-8", "replace").splitlines() if line.strip()]
    return lines[-1].strip() if lines else "no message"


def _git(where: Path, *args: str, env: dict[str, str] | None = None) -> bytes:
    proc = _run(where, *args, env=env)
    if proc.returncode:
        raise RepositoryError(f"{where}: git {args[0]} failed: {_tail(proc.stderr)}")
    return proc.stdout


def _name(raw: bytes) -> tuple[str, bool]:
    """A name from git's output, and whether it is UTF-8 (else its odd bytes are kept as surrogates)."""
    try:
        return raw.decode("utf-8"), True
    except UnicodeDecodeError:
        return raw.decode("utf-8", "surrogateescape"), False


def _revision(rev: str) -> str:
    if not rev or rev.startswith("-") or "\0" in rev:
        raise UnknownRevision(f"not a revision: {rev!r}")
    return rev


def open_repository(path: str | Path) -> Repository:
    """The repository whose work tree top (or git directory) is `path`; a folder inside one is not one."""
    where = Path(path).expanduser()
    if not where.is_dir():
        raise RepositoryError(f"{where}: not a repository (no such folder)")
    where = where.resolve()
    proc = _run(where, "rev-parse", "--absolute-git-dir", env=_env(GIT_CEILING_DIRECTORIES=str(where.parent)))
    if proc.returncode:
        raise RepositoryError(f"{where}: not a git repository ({_tail(proc.stderr)})")
    git_dir = Path(_name(proc.stdout.rstrip(b"\n"))[0])
    head = _run(where, "rev-parse", "--verify", "--quiet", "HEAD^{commit}")
    sha = head.stdout.decode().strip() if head.returncode == 0 else None
    submodules = ()
    if sha:
        entries = _git(where, "ls-tree", "-r", "-z", "--full-tree", sha).split(b"\0")
        submodules = tuple(_name(e.split(b"\t", 1)[1])[0] for e in entries if e.startswith(GITLINK + b" "))
    return Repository(where, git_dir, git_dir == where, sha, submodules)


def _repository(repo: Repository | str | Path) -> Repository:
    return repo if isinstance(repo, Repository) else open_repository(repo)


def resolve(repo: Repository | str | Path, rev: str) -> str:
    """The commit id `rev` names in `repo`; `UnknownRevision` naming both when there is none."""
    repo = _repository(repo)
    proc = _run(repo.path, "rev-parse", "--verify", "--quiet", f"{_revision(rev)}^{{commit}}")
    if proc.returncode:
        raise UnknownRevision(f"{repo.path}: unknown revision {rev!r}")
    return proc.stdout.decode().strip()


# -- candidates ---------------------------------------------------------------------------------------------------
def is_test_path(path: str, extra_globs: Iterable[str] = ()) -> bool:
    """A test file in the usual Python layouts: under a `tests/`, `test/` or `testing/` folder at any depth, or
    named `test_*.py`, `*_test.py` or `conftest.py`; or matching one of `extra_globs` (fnmatch on the whole
    path: `*` crosses `/`)."""
    parts = PurePosixPath(path).parts
    name = parts[-1] if parts else ""
    if any(part in TEST_DIRS for part in parts[:-1]):
        return True
    if name == "conftest.py" or name.endswith("_test.py") or name.startswith("test_") and name.endswith(".py"):
        return True
    return any(fnmatchcase(path, glob) for glob in extra_globs)


def diff_key(diff: str) -> str:
    """What two diffs of the same change share wherever they apply: the diff without its `index` and similarity
    lines, its hunk headers reduced to `@@`."""
    kept = [("@@" if line.startswith("@@ ") else line) for line in diff.split("\n")
            if not line.startswith(("index ", "similarity index ", "dissimilarity index "))]
    return hashlib.sha256("\n".join(kept).encode("utf-8", "surrogateescape")).hexdigest()


@dataclass(frozen=True)
class _Change:
    file: ChangedFile
    utf8: bool
    gitlink: bool
    lines: tuple[int, int] | None  # added, removed; None: binary


def _changes(repo: Repository, parent: str, sha: str) -> list[_Change]:
    """The files `sha` changes against `parent`, from one `diff-tree --raw --numstat -z` (raw entries first)."""
    tokens = _git(repo.path, "diff-tree", "-r", "-z", "-M", "--raw", "--numstat", parent, sha).split(b"\0")
    raw, stats, i = [], {}, 0
    while i < len(tokens) and tokens[i].startswith(b":"):
        meta = tokens[i][1:].split()  # old mode, new mode, old blob, new blob, status (R with its score)
        paired = meta[4][:1] in (b"R", b"C")
        old, new = (tokens[i + 1], tokens[i + 2]) if paired else (None, tokens[i + 1])
        raw.append((meta[4][:1].decode(), old, new, GITLINK in meta[:2]))
        i += 3 if paired else 2
    while i < len(tokens) and tokens[i]:
        added, removed, path = tokens[i].split(b"\t", 2)
        path, i = (tokens[i + 2], i + 3) if not path else (path, i + 1)
        stats[path] = None if added == b"-" else (int(added), int(removed))
    out = []
    for status, old, new, gitlink in raw:
        (name, ok), (old_name, old_ok) = _name(new), _name(old) if old else (None, True)
        out.append(_Change(ChangedFile(name, status, old_name), ok and old_ok, gitlink, stats.get(new, (0, 0))))
    return out


def _diff(repo: Repository, parent: str, sha: str, files: Iterable[ChangedFile]) -> bytes:
    specs = [":(literal)" + p for f in files for p in (f.old_path, f.path) if p]
    return _git(repo.path, "-c", "core.quotePath=false", "diff", *DIFF_FLAGS, parent, sha, "--", *specs)


def _consider(repo: Repository, sha: str, require_test_change: bool, max_code_lines: int,
              test_globs: tuple[str, ...]) -> Candidate | Skipped:
    meta = _git(repo.path, "show", "-s", "--no-show-signature", "--format=%P%x00%aI%x00%s%x00%b", sha)
    parents, date, subject, body = meta.decode("utf-8", "replace").split("\0", 3)
    parents = parents.split()
    if len(parents) != 1:
        return Skipped(sha, "merge", f"{len(parents)} parents") if parents else Skipped(sha, "root_commit")
    parent, changes = parents[0], _changes(repo, parents[0], sha)
    code = [c for c in changes if not is_test_path(c.file.path, test_globs)]
    tests = [c for c in changes if is_test_path(c.file.path, test_globs)]
    added, removed = (sum(c.lines[k] for c in code if c.lines) for k in (0, 1))
    if any(c.gitlink for c in changes):
        return Skipped(sha, "submodule_change", ", ".join(c.file.path for c in changes if c.gitlink))
    if not all(c.utf8 for c in changes):
        return Skipped(sha, "non_utf8", "a changed file's name is not UTF-8")
    if not code:
        return Skipped(sha, "no_code_change")
    if not any(p and p.endswith(PYTHON_SUFFIXES) for c in code for p in (c.file.path, c.file.old_path)):
        return Skipped(sha, "non_python_only", ", ".join(c.file.path for c in code))
    if any(c.lines is None for c in changes):
        return Skipped(sha, "binary_change", ", ".join(c.file.path for c in changes if c.lines is None))
    if require_test_change and not tests:
        return Skipped(sha, "no_test_change")
    if added + removed > max_code_lines or len(changes) > MAX_FILES:
        return Skipped(sha, "too_large", f"{added + removed} code lines, {len(changes)} files")
    try:
        code_diff, test_diff = (_diff(repo, parent, sha, [c.file for c in group]).decode("utf-8")
                                if group else "" for group in (code, tests))
    except UnicodeDecodeError:
        return Skipped(sha, "non_utf8", "the diff's text is not UTF-8")
    return Candidate(sha, parent, date, subject, body.rstrip("\n"), tuple(c.file for c in code),
                     tuple(c.file for c in tests), code_diff, test_diff, added, removed)


def _commits(repo: Repository, rev_range: str | None, max_count: int | None, paths: list[str] | None) -> list[str]:
    if rev_range is None and repo.head is None:
        return []
    args = ["rev-list", "--reverse", "--date-order"] + ([f"--max-count={max_count}"] if max_count is not None else [])
    proc = _run(repo.path, *args, _revision("HEAD" if rev_range is None else rev_range), "--", *(paths or []))
    if proc.returncode:
        raise UnknownRevision(f"{repo.path}: unknown revision or range {rev_range!r}: {_tail(proc.stderr)}")
    return proc.stdout.decode().split()


def candidates(repo: Repository | str | Path, rev_range: str | None = None, max_count: int | None = None,
               paths: list[str] | None = None, *, require_test_change: bool = True,
               max_code_lines: int = MAX_CODE_LINES, test_globs: Iterable[str] = ()) -> Iterator[Candidate | Skipped]:
    """One `Candidate` or `Skipped` per commit of `rev_range` (one `git rev-list` argument: `A..B`, `REV`;
    default the whole history of HEAD), oldest first (parents before children, else by commit date); only the
    newest `max_count` of them, and only commits touching `paths` (pathspecs) when given. With
    `require_test_change=False` a commit that changes no test is a candidate too (its tests come from the suite
    as it is)."""
    if max_count is not None and max_count < 0:
        raise ValueError(f"max_count must be >= 0, not {max_count}")
    repo, globs, first = _repository(repo), tuple(test_globs), {}
    for sha in _commits(repo, rev_range, max_count, paths):
        outcome = _consider(repo, sha, require_test_change, max_code_lines, globs)
        if isinstance(outcome, Candidate):
            key = diff_key(outcome.code_diff)
            if key in first:
                outcome = Skipped(sha, f"duplicate_of:{first[key]}", "the same code diff")
            else:
                first[key] = sha
        yield outcome


def scan(repo: Repository | str | Path, rev_range: str | None = None, max_count: int | None = None,
         paths: list[str] | None = None, **options) -> tuple[list[Candidate], list[Skipped]]:
    """`candidates`, split into the kept and the skipped (each in commit order)."""
    kept, skipped = [], []
    for outcome in candidates(repo, rev_range, max_count, paths, **options):
        (kept if isinstance(outcome, Candidate) else skipped).append(outcome)
    return kept, skipped


# -- trees --------------------------------------------------------------------------------------------------------
def _staging(dest: Path) -> Path:
    """A fresh temporary sibling of `dest` (which must be absent or an empty folder), renamed onto it at the end."""
    if dest.is_symlink() or dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise RepositoryError(f"{dest}: not an empty folder")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".partial", dir=dest.parent))
    tmp.chmod(0o755)
    return tmp


def _extract(repo: Repository, sha: str, into: Path) -> None:
    """`git archive` of `sha` streamed into tarfile. Attributes come from an empty work tree and index only, so
    no `.gitattributes` of the tree exports-ignores, substitutes or converts anything: the exact blobs."""
    with tempfile.TemporaryDirectory() as empty, tempfile.TemporaryFile() as err:
        env = _env(GIT_DIR=str(repo.git_dir), GIT_WORK_TREE=empty, GIT_INDEX_FILE=os.path.join(empty, "index"))
        cmd = ["git", "-c", "core.autocrlf=false", "-c", f"core.attributesFile={os.devnull}", "archive",
               "--worktree-attributes", "--format=tar", sha]
        proc = subprocess.Popen(cmd, cwd=empty, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err)
        try:
            with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
                tar.extractall(into, filter="data")
            while proc.stdout.read(1 << 16):  # the blocks after the end marker: git dies of SIGPIPE if unread
                pass
        except (tarfile.TarError, OSError) as e:
            raise RepositoryError(f"{repo.path}: the tree of {sha} cannot be extracted: {e}") from e
        finally:
            proc.stdout.close()
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        if proc.returncode:
            err.seek(0)
            raise RepositoryError(f"{repo.path}: git archive {sha} failed: {_tail(err.read())}")


def checkout(repo: Repository | str | Path, rev: str, dest: str | Path) -> Path:
    """The tree of `rev` written into `dest` (absent or an empty folder), or nothing written at all."""
    repo, dest = _repository(repo), Path(dest)
    sha = resolve(repo, rev)
    tmp = _staging(dest)
    try:
        _extract(repo, sha, tmp)
        tmp.rename(dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def releases_as_history(versions: list[tuple[str, Path]], dest: str | Path) -> Path:
    """A git repository in `dest` with one commit per `(label, source tree)` in the given order, on branch `main`,
    each tagged with its label, the last one checked out: a history for projects known only by their released
    source trees (unpacked sdists). Every file of a tree is committed, ignored ones too; the message is the
    label; the commit ids depend only on the trees and labels."""
    dest = Path(dest)
    labels = [label for label, _ in versions]
    if not versions or len(set(labels)) != len(labels):
        raise RepositoryError(f"{dest}: releases need one or more versions with distinct labels, not {labels}")
    for label, tree in versions:
        if _run(Path(os.sep), "check-ref-format", f"refs/tags/{label}").returncode:
            raise RepositoryError(f"{dest}: version {label!r} is not a valid tag name")
        if not Path(tree).is_dir():
            raise RepositoryError(f"{tree}: the source tree of version {label!r} is not a folder")
    env = _env(GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1", **RELEASE_IDENTITY)
    tmp = _staging(dest)
    try:
        _git(tmp, "init", "-q", "--template=", env=env)
        _git(tmp, "symbolic-ref", "HEAD", "refs/heads/main", env=env)
        git_dir, parent = f"--git-dir={tmp / '.git'}", None
        for day, (label, tree) in enumerate(versions):
            date = f"{RELEASE_EPOCH + day * 86400} +0000"
            dated = {**env, "GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
            tree = Path(tree).resolve()
            _git(tmp, "read-tree", "--empty", env=dated)
            _git(tree, git_dir, f"--work-tree={tree}", "add", "--all", "--force", env=dated)
            root = _git(tmp, "write-tree", env=dated).decode().strip()
            parents = ["-p", parent] if parent else []
            parent = _git(tmp, "commit-tree", root, *parents, "-m", label, env=dated).decode().strip()
            _git(tmp, "update-ref", f"refs/tags/{label}", parent, env=dated)
        _git(tmp, "update-ref", "refs/heads/main", parent, env=env)
        _git(tmp, "read-tree", "--empty", env=env)
        _git(tmp, "reset", "-q", "--hard", "main", env=env)
        tmp.rename(dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest
