"""How a Python project is installed and tested, read from its source tree (issue 43): `detect(tree)` gives a
`Project`, `test_command(project, report, node_ids)` the argument list that runs its tests into a JUnit report.

Invariants:
- Reading only: nothing in the tree is run or written, and nothing outside it is read: a link leading out of the
  tree (or in a loop) is not a file of the project (`inside`), never followed. TOML is read with `tomllib`, ini files with `configparser`
  (no interpolation), `setup.py` with `ast`: a `setup(...)` keyword (`name`, `version`, `install_requires`,
  `extras_require`, `python_requires`) counts only as a literal or a module-level name bound to one; anything
  computed is unknown (None), never guessed.
- The tree is walked as pytest walks it: hidden folders, `__pycache__`, `build`, `dist`, `venv`, `node_modules`,
  `*.egg*`, `CVS`, `_darcs`, `{arch}` and virtualenvs (a `pyvenv.cfg`) are skipped. Paths are relative, with `/`.
- The install step is one `python -m pip install` from the tree's root: runtime requirement files
  (`requirements.txt`, `requirements/{base,main,...}.txt`), then `-e .[EXTRAS]` when pip can build the tree (a
  `setup.py`, or a `pyproject.toml` with a build backend, a `[project]` table or a declarative `setup.cfg`), then
  the test requirement files (`requirements-test.txt`, `test-requirements.txt`, `requirements/test*.txt`, ...), the
  test dependency groups (PEP 735), and `pytest` when none of them names it. EXTRAS (and files, groups) are those
  named `test`, `tests`, `testing`, or `dev` when there is none of those (`dev` often pulls linters and docs tools).
  Editable: the tests import the tree an agent edits, whatever the layout (`src/` included).
- The runner is pytest, which also runs unittest-style tests; `evidence` says why (a pytest config, a
  `conftest.py`, pytest in the test requirements, test files). No `.py` file raises `ProjectError("no Python")`; no
  test file (pytest's `python_files`, by default `test_*.py` and `*_test.py`, under `testpaths` when set)
  `ProjectError("no tests")`.
- `test_paths`: `testpaths` (globs expanded) of the config pytest itself reads (the first of `pytest.toml`,
  `.pytest.toml`, `pytest.ini`, `.pytest.ini`, `pyproject.toml`, `tox.ini`, `setup.cfg` that configures it), else
  the top-most `tests`/`test`/`testing` folder of each test file (or the file itself).
- `override` (from config) replaces what is detected: `test_command` (a string or argument list that runs pytest;
  the report and the selection are appended), `install` (a command string, or a list of strings or argument
  lists; `[]` installs nothing), `test_paths` (each must match something; the "no tests" check is then skipped),
  `deselect` (node ids or node-id prefixes, as pytest's `--deselect` takes them: tests left out of every run, e.g.
  a slow test that would make each probe of a candidate cost seconds more; never in a task's lists).
  Any other key raises `ProjectError` naming it.
- Bad input is a `ProjectError` naming the file and, where there is one, the line: a pyproject, config file or
  `setup.py` that does not parse, a file that is not UTF-8, a tree that is not a folder.
"""

from __future__ import annotations

import ast
import configparser
import os
import re
import shlex
import tomllib
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path, PurePosixPath

from ....schemas.config import PROJECT_KEYS
from ....schemas.pysource import parse as parse_python

PYTHON = "python"  # the image's interpreter as commands name it; a caller that names it otherwise replaces argv[0]
TEST_EXTRAS = ("test", "tests", "testing")
DEV = "dev"  # the fallback extra, requirement file or dependency group when no test one is declared
TEST_DIRS = frozenset({"tests", "test", "testing"})
RUNTIME_WORDS = frozenset({"", "base", "main", "prod", "production", "runtime", "install", "common", "core"})
PYTHON_FILES = ("test_*.py", "*_test.py")  # pytest's default `python_files`
NORECURSE = ("*.egg", "*.egg-info", ".*", "_darcs", "build", "CVS", "dist", "node_modules", "venv", "{arch}",
             "__pycache__", "site-packages")
PYTEST_CONFIGS = ("pytest.toml", ".pytest.toml", "pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini",
                  "setup.cfg")
OVERRIDE_KEYS = PROJECT_KEYS
SETUP_FIELDS = frozenset({"name", "version", "install_requires", "extras_require", "python_requires"})
KEPT_WITH_VALUE = ("--import-mode", "-p", "--ignore", "--ignore-glob", "--deselect", "-m", "-W", "--pythonwarnings",
                   "--doctest-glob")
KEPT_FLAGS = frozenset({"--doctest-modules"})
TEST_ENV = {"PYTEST_ADDOPTS": ""}  # the environment `test_command` assumes: no caller's options slip in
REQUIREMENT = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


class ProjectError(ValueError):
    """A tree that is not a testable Python project, or a project file that cannot be read."""

    def __init__(self, path: str | Path, line: int | None, reason: str):
        self.path, self.line, self.reason = str(path), line, reason
        super().__init__(f"{path}:{line}: {reason}" if line else f"{path}: {reason}")


@dataclass(frozen=True)
class Project:
    name: str | None
    version: str | None
    python_requires: str | None
    requires: tuple[str, ...]  # the runtime requirements it declares (pyproject, setup.cfg or a literal setup.py)
    installable: bool  # pip can build the tree (`-e .` is in the install step)
    extras: tuple[str, ...]  # installed with it, e.g. ("test",)
    requirement_files: tuple[str, ...]  # installed with `-r`: runtime ones, then test ones
    install: tuple[tuple[str, ...], ...]  # commands run in order from the tree's root
    evidence: tuple[str, ...]  # why pytest, e.g. ("pyproject.toml [tool.pytest.ini_options]", "conftest.py")
    pytest_config: str | None  # the file pytest reads its options from
    test_paths: tuple[str, ...]
    addopts: tuple[str, ...] = ()  # the options of the project's `addopts` that `test_command` keeps
    test_command: tuple[str, ...] | None = None  # from `override`: replaces pytest's own invocation
    runner: str = "pytest"
    test_requires: tuple[str, ...] = ()  # the requirements of the chosen extras and dependency groups
    deselect: tuple[str, ...] = ()  # from `override`: node ids (or prefixes) left out of every run


# -- reading files ------------------------------------------------------------------------------------------------
def inside(tree: Path, path: Path) -> bool:
    """Whether `path`, links followed, stays in `tree` (an untrusted tree's link may lead anywhere on the host)."""
    try:
        path.resolve().relative_to(tree.resolve())
    except (ValueError, OSError, RuntimeError):  # outside, unreadable, or a loop of links
        return False
    return True


def _read(tree: Path, name: str) -> str | None:
    path = tree / name
    if not path.is_file() or not inside(tree, path):  # a link out of the tree is never read
        return None
    try:
        return path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ProjectError(path, None, f"not UTF-8 (byte {e.start})") from e


def _toml(tree: Path, name: str) -> dict | None:
    text = _read(tree, name)
    if text is None:
        return None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        line = re.search(r"at line (\d+)", str(e))
        raise ProjectError(tree / name, int(line.group(1)) if line else None, f"does not parse: {e}") from e


def _ini(tree: Path, name: str) -> configparser.ConfigParser | None:
    text = _read(tree, name)
    if text is None:
        return None
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    try:
        parser.read_string(text, str(tree / name))
    except configparser.Error as e:
        line = getattr(e, "lineno", None) or next((n for n, _ in getattr(e, "errors", ())), None)
        raise ProjectError(tree / name, line, f"does not parse: {e.message.splitlines()[0]}") from e
    return parser


def _literal(node: ast.AST, constants: dict[str, object]) -> object:
    if isinstance(node, ast.Name):
        return constants.get(node.id)
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def _setup_py(tree: Path) -> dict[str, object]:
    """The literal keywords of `setup(...)` in `setup.py`, which is parsed, never run."""
    text = _read(tree, "setup.py")
    if text is None:
        return {}
    try:
        module = parse_python(text, "setup.py")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as e:
        raise ProjectError(tree / "setup.py", getattr(e, "lineno", None), f"does not parse: {e}") from e
    constants: dict[str, object] = {}
    for node in module.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            constants[node.targets[0].id] = _literal(node.value, {})
    calls = [node for node in ast.walk(module) if isinstance(node, ast.Call)
             and "setup" in (getattr(node.func, "id", None), getattr(node.func, "attr", None))]
    call = max(calls, key=lambda c: sum(kw.arg in SETUP_FIELDS for kw in c.keywords), default=None)
    return {kw.arg: value for kw in call.keywords if kw.arg in SETUP_FIELDS
            if (value := _literal(kw.value, constants)) is not None} if call else {}


def _lines(value: object) -> list[str]:
    """Requirement strings from a TOML list, a Python list or tuple, or an ini value (one a line)."""
    if isinstance(value, str):
        value = value.splitlines()
    if not isinstance(value, (list, tuple)):
        return []
    return [v.strip() for v in value if isinstance(v, str) and v.strip() and not v.strip().startswith("#")]


def _names(requirements: list[str]) -> set[str]:
    """Normalized project names (PEP 503) of requirement strings."""
    return {re.sub(r"[-_.]+", "-", m.group(1)).lower() for r in requirements if (m := REQUIREMENT.match(r))}


# -- the tree -----------------------------------------------------------------------------------------------------
def _files(tree: Path) -> list[str]:
    found = []
    for top, dirs, names in os.walk(tree):
        dirs[:] = sorted(d for d in dirs if not any(fnmatchcase(d, p) for p in NORECURSE)
                         and not (Path(top) / d / "pyvenv.cfg").exists())
        rel = PurePosixPath(Path(top).relative_to(tree).as_posix())
        found += [str(rel / n) if str(rel) != "." else n for n in names if inside(tree, Path(top) / n)]
    return sorted(found)


def _is_test_file(path: str, patterns: tuple[str, ...]) -> bool:
    name = PurePosixPath(path).name
    return any(fnmatchcase(path if "/" in p else name, p) for p in patterns)


def _under(path: str, top: str) -> bool:
    top = top.rstrip("/")
    return top in ("", ".") or path == top or path.startswith(top + "/")


def _test_dir(path: str) -> str:
    parts = PurePosixPath(path).parts
    for i, part in enumerate(parts[:-1]):
        if part in TEST_DIRS:
            return "/".join(parts[:i + 1])
    return path


def _globbed(tree: Path, patterns: list[str]) -> list[str]:
    """Each pattern's matches in the tree, relative, in the patterns' order; an unmatched pattern gives nothing."""
    out: list[str] = []
    for pattern in patterns:
        if pattern.startswith("/") or ".." in PurePosixPath(pattern).parts:
            continue
        try:
            matches = sorted(p.relative_to(tree).as_posix() for p in tree.glob(pattern)) if pattern.strip("./") \
                else ["."]
        except ValueError:  # not a pattern pathlib accepts (`**x`): pytest matches nothing either
            continue
        out += [m for m in matches if m not in out]
    return out


# -- requirements -------------------------------------------------------------------------------------------------
def _file_kind(path: str) -> str | None:
    """`runtime`, `test`, `dev` or None (docs, lint, ...) for a requirements file found in the tree."""
    p = PurePosixPath(path)
    if p.suffix != ".txt" or not (len(p.parts) == 1 and "requirements" in p.name
                                  or len(p.parts) == 2 and p.parts[0] == "requirements"):
        return None
    words = set(re.split(r"[-_.]+", p.stem)) - {"requirements", "requirement", "reqs"}
    words.discard("")
    if words & TEST_DIRS:
        return "test"
    if DEV in words:
        return DEV
    return "runtime" if words <= RUNTIME_WORDS else None


def file_requirements(tree: Path, path: str) -> list[str]:
    """The requirement lines of a requirements file (not its options nor `-r` includes: pip follows those, and a
    `pytest` added when the file does not name it is only redundant)."""
    lines = (raw.split(" #", 1)[0].strip() for raw in (_read(tree, path) or "").splitlines())
    return [line for line in lines if line and not line.startswith(("#", "-"))]


def _groups(pyproject: dict, chosen: tuple[str, ...]) -> list[str]:
    """Requirement strings of PEP 735 dependency groups, `include-group` followed."""
    groups = pyproject.get("dependency-groups")
    if not isinstance(groups, dict):
        return []
    out: list[str] = []
    todo, seen = list(chosen), set()
    while todo:
        name = todo.pop(0)
        items = groups.get(name) if name not in seen else None
        seen.add(name)
        for item in items if isinstance(items, list) else ():
            if isinstance(item, dict) and isinstance(item.get("include-group"), str):
                todo.append(item["include-group"])
            elif isinstance(item, str) and REQUIREMENT.match(item) and item.strip() not in out:
                out.append(item.strip())
    return out


def _choose(declared: set[str] | dict) -> tuple[str, ...]:
    tests = tuple(name for name in TEST_EXTRAS if name in declared)
    return tests or ((DEV,) if DEV in declared else ())


# -- pytest -------------------------------------------------------------------------------------------------------
def _pytest_config(tree: Path, pyproject: dict | None, cfg: configparser.ConfigParser | None,
                   ) -> tuple[str, str, dict] | None:
    """(file, what in it, options) of the pytest config pytest would read from the tree's root."""
    for name in PYTEST_CONFIGS:
        dedicated = name.startswith(("pytest.", ".pytest."))  # the config even with no pytest table in it
        if name.endswith(".toml"):
            doc = pyproject if name == "pyproject.toml" else _toml(tree, name)
            tool = (doc or {}).get("tool", {}).get("pytest") if isinstance((doc or {}).get("tool"), dict) else None
            for label, table in (("[pytest]", (doc or {}).get("pytest") if dedicated else None),
                                 ("[tool.pytest.ini_options]", isinstance(tool, dict) and tool.get("ini_options")),
                                 ("[tool.pytest]", tool)):
                if isinstance(table, dict):
                    return name, label, table
        else:
            doc = cfg if name == "setup.cfg" else _ini(tree, name)
            section = "tool:pytest" if name == "setup.cfg" else "pytest"
            if doc is not None and doc.has_section(section):
                return name, f"[{section}]", dict(doc.items(section))
        if doc is not None and dedicated:
            return name, "", {}
    return None


def _args(value: object, where: str) -> list[str]:
    """An option of pytest's `args` type: a TOML list, or an ini string split as a shell would."""
    if isinstance(value, list):
        return [str(v) for v in value]
    try:
        return shlex.split(value) if isinstance(value, str) else []
    except ValueError as e:
        raise ProjectError(where, None, f"pytest option does not parse: {e}") from e


def kept_addopts(addopts: list[str]) -> tuple[str, ...]:
    """The options of a project's `addopts` that `test_command` passes again (see `test_command`)."""
    kept: list[str] = []
    i = 0
    while i < len(addopts):
        arg = addopts[i]
        if arg in KEPT_FLAGS:
            kept.append(arg)
        elif arg in KEPT_WITH_VALUE and i + 1 < len(addopts):
            kept += [arg, addopts[i + 1]]
            i += 1
        elif any(arg.startswith(o + "=") or (not o.startswith("--") and arg.startswith(o) and len(arg) > 2)
                 for o in KEPT_WITH_VALUE):
            kept.append(arg)
        i += 1
    return tuple(kept)


# -- overrides ----------------------------------------------------------------------------------------------------
def _argv(value: object, key: str) -> tuple[str, ...]:
    if isinstance(value, str):
        try:
            value = shlex.split(value)
        except ValueError as e:
            raise ProjectError("override", None, f"{key}: {e}") from e
    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(v, str) for v in value):
        raise ProjectError("override", None, f"{key}: expected a command string or a non-empty list of strings")
    return tuple(value)


def _override(override: dict | None) -> dict:
    if not isinstance(override or {}, dict):
        raise ProjectError("override", None, "expected a mapping")
    unknown = sorted(set(override or {}) - set(OVERRIDE_KEYS))
    if unknown:
        raise ProjectError("override", None, f"unknown keys {unknown}; known: {list(OVERRIDE_KEYS)}")
    out = dict(override or {})
    listed = {k: [v] if isinstance(v, str) else v for k, v in out.items()}
    if not all(isinstance(v, (list, tuple)) for v in listed.values()):
        raise ProjectError("override", None, f"{sorted(out)}: expected a string or a list")
    if "test_command" in out:
        out["test_command"] = _argv(out["test_command"], "test_command")
    if "install" in out:
        out["install"] = tuple(_argv(c, "install") for c in listed["install"])
    if "test_paths" in out:
        if not listed["test_paths"] or not all(isinstance(p, str) and p for p in listed["test_paths"]):
            raise ProjectError("override", None, "test_paths: expected a path or a non-empty list of paths")
        out["test_paths"] = list(listed["test_paths"])
    if "deselect" in out:
        bad = [d for d in listed["deselect"] if not isinstance(d, str) or not d or d.startswith("-") or "\0" in d]
        if bad or not listed["deselect"]:
            raise ProjectError("override", None, f"deselect: expected node ids (tests/x.py::test_y), not {bad[:3]}")
        out["deselect"] = tuple(listed["deselect"])
    return out


# -- detection ----------------------------------------------------------------------------------------------------
def detect(tree: str | Path, override: dict | None = None) -> Project:
    """How the project in `tree` installs and runs its tests (see the module's invariants)."""
    tree = Path(tree)
    if not tree.is_dir():
        raise ProjectError(tree, None, "not a folder")
    given = _override(override)
    files = _files(tree)
    if not any(f.endswith(".py") for f in files):
        raise ProjectError(tree, None, "no Python: the tree has no .py file")
    pyproject = _toml(tree, "pyproject.toml")
    cfg = _ini(tree, "setup.cfg")
    setup = _setup_py(tree)
    doc = pyproject or {}
    meta = doc.get("project") if isinstance(doc.get("project"), dict) else {}
    tool = doc.get("tool") if isinstance(doc.get("tool"), dict) else {}
    poetry = tool.get("poetry") if isinstance(tool.get("poetry"), dict) else {}
    cfg_meta = dict(cfg.items("metadata")) if cfg is not None and cfg.has_section("metadata") else {}
    cfg_opts = {k.replace("-", "_"): v for k, v in cfg.items("options")} \
        if cfg is not None and cfg.has_section("options") else {}

    def first(*values: object) -> str | None:
        return next((v.strip() for v in values if isinstance(v, str) and v.strip()
                     and not v.strip().startswith(("attr:", "file:"))), None)

    extras_req: dict[str, list[str]] = {}
    for source in (setup.get("extras_require"), meta.get("optional-dependencies"),
                   dict(cfg.items("options.extras_require")) if cfg and cfg.has_section("options.extras_require")
                   else None):
        for extra, reqs in (source or {}).items() if isinstance(source, dict) else ():
            extras_req.setdefault(str(extra), []).extend(_lines(reqs))
    extras = _choose(extras_req)
    installable = "setup.py" in files or pyproject is not None and (
        isinstance(doc.get("build-system"), dict) and "build-backend" in doc["build-system"]
        or bool(meta) or bool(cfg_meta or cfg_opts))

    kinds = {f: k for f in files if (k := _file_kind(f))}
    runtime_files = [f for f, k in kinds.items() if k == "runtime"]
    test_files_req = [f for f, k in kinds.items() if k == "test"] or [f for f, k in kinds.items() if k == DEV]
    groups = _groups(doc, _choose(doc.get("dependency-groups") or {}))
    test_requirements = [r for f in test_files_req for r in file_requirements(tree, f)] + groups \
        + [r for e in extras for r in extras_req[e]]
    pytest_declared = "pytest" in _names(test_requirements)

    found = _pytest_config(tree, pyproject, cfg)
    options = found[2] if found else {}
    where = str(tree / found[0]) if found else str(tree)
    patterns = tuple(_args(options.get("python_files"), where)) or PYTHON_FILES
    testpaths = _globbed(tree, _args(options.get("testpaths"), where))
    test_files = [f for f in files if _is_test_file(f, patterns)
                  and (not testpaths or any(_under(f, t) for t in testpaths))]

    if "test_paths" in given:
        missing = [p for p in given["test_paths"] if not _globbed(tree, [p])]
        if missing:
            raise ProjectError(tree, None, f"test_paths {missing} match nothing in the tree")
        test_paths = tuple(_globbed(tree, given["test_paths"]))
    elif not test_files:
        raise ProjectError(tree, None, f"no tests: no file matching {' or '.join(patterns)}"
                                       + (f" under testpaths {testpaths}" if testpaths else ""))
    else:
        tops = sorted({_test_dir(f) for f in test_files})
        test_paths = tuple(testpaths) or tuple(t for t in tops if not any(t != o and _under(t, o) for o in tops))

    evidence = [f"{found[0]} {found[1]}".strip()] if found else []
    evidence += ["conftest.py"] if any(PurePosixPath(f).name == "conftest.py" for f in files) else []
    evidence += ["pytest in the test requirements"] if pytest_declared else []
    evidence += ["test files"] if test_files else []

    pip = [PYTHON, "-m", "pip", "install"]
    pip += [a for f in runtime_files for a in ("-r", f)]
    pip += ["-e", f".[{','.join(extras)}]" if extras else "."] if installable else []
    pip += [a for f in test_files_req for a in ("-r", f)] + groups + ([] if pytest_declared else ["pytest"])
    return Project(
        name=first(meta.get("name"), poetry.get("name"), cfg_meta.get("name"), setup.get("name")),
        version=first(meta.get("version"), poetry.get("version"), cfg_meta.get("version"), setup.get("version")),
        python_requires=first(meta.get("requires-python"), cfg_opts.get("python_requires"),
                              setup.get("python_requires")),
        requires=tuple(_lines(meta.get("dependencies")) or _lines(cfg_opts.get("install_requires"))
                       or _lines(setup.get("install_requires"))),
        installable=installable, extras=extras, requirement_files=tuple(runtime_files + test_files_req),
        install=given.get("install", (tuple(pip),)), evidence=tuple(evidence),
        pytest_config=found[0] if found else None, test_paths=test_paths,
        addopts=kept_addopts(_args(options.get("addopts"), where)), test_command=given.get("test_command"),
        test_requires=tuple(groups + [r for e in extras for r in extras_req[e]]), deselect=given.get("deselect", ()))


def test_command(project: Project, report: str, node_ids: list[str] | None = None, *,
                 python: str = PYTHON) -> list[str]:
    """The argument list that runs the project's tests from the tree's root (in `TEST_ENV`) and writes pytest's
    JUnit XML to `report`: the tests `node_ids` name (as pytest prints them), or all of `test_paths` when None.

    What it overrides, and why (the run must be the same on every tree of a task and need nothing not installed):
    - `-o addopts=`: the project's `addopts` are dropped (`-x`/`--maxfail` would stop before the tests that matter,
      `--cov`/`-n`/`--reruns`/`--timeout` need plugins the image may lack or hide flakiness, `--lf`/`--ff` depend on
      a cache); only `kept_addopts` come back: what decides which tests exist and how they import
      (`--import-mode`, `-p`, `--ignore*`, `--deselect`, `-m`, `-W`, `--doctest-modules`, `--doctest-glob`).
    - `-p no:cacheprovider`: nothing written into the tree; `-p no:randomly`: the suite's order is its own.
    - `--continue-on-collection-errors`: a test module that does not import (a test of a function not written yet)
      is one error, not an interrupted run with every other test missing.
    - `--rootdir=.`: node ids are relative to the tree's root even when a config file sits deeper.
    - `-o junit_family=xunit1`: each test case names its `file`, so `testlists.parse_junit` maps it back exactly.
    A `test_command` override is used as given, with only `--junitxml=REPORT`, the `deselect` override's
    `--deselect` options and the selection appended.
    """
    if node_ids is not None and not node_ids:
        raise ValueError("no node ids: pass None to run every test")
    bad = [n for n in node_ids or () if not n or n.startswith("-") or "\0" in n]
    if bad:
        raise ValueError(f"not node ids: {bad[:3]}")
    selection = list(node_ids) if node_ids is not None else list(project.test_paths)
    left_out = [a for d in project.deselect for a in ("--deselect", d)]
    if project.test_command:
        return [*project.test_command, f"--junitxml={report}", *left_out, *selection]
    return [python, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", "-o", "addopts=",
            "-o", "junit_family=xunit1", "--rootdir=.", "--continue-on-collection-errors", f"--junitxml={report}",
            "-q", "--tb=short", *project.addopts, *left_out, *selection]


test_command.__test__ = False  # a library function, not a test, wherever a test module imports it
