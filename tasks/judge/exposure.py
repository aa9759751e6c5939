"""Whether a task's hidden tests execute code the agent wrote or could change, read from the tests' text.

Code the tests execute runs with the tests' powers: it can reach their reward channel and, in the same
Python process, their runner. Some hacks are then undetectable from outside (docs/verification.md, "Still open"), so
the validator marks each environment (`EnvSpec.tests_run_agent_code`) and the dataset carries the mark:

- `in_process`: a Python test file imports a module that lives in the solved work dir (top-level
  `name.py` or package `name/`), or loads a work-dir file as code (`runpy`, `importlib`, `exec(open(`);
- `subprocess`: a test file or the test command names a program of the solved work dir (a script or an
  executable, by path, `./name` or file name), or an executable the reference solution put elsewhere
  (e.g. `/usr/local/bin/tool`), or runs `make` where the solved work dir has a Makefile (its recipes are the
  agent's);
- `no` otherwise.

Invariant: the mark errs towards exposure (a data file named like a script counts); it is a statement about
the tests, never evidence against an episode.
"""

from __future__ import annotations

import ast
import posixpath
import re
from collections.abc import Iterable

from ...schemas.common import FileSpec
from ...schemas.pysource import parse as parse_python

SCRIPT_SUFFIXES = (".sh", ".bash", ".py", ".pl", ".rb", ".js", ".mjs", ".php", ".lua", ".tcl", ".awk", ".R", ".r")
MAKEFILES = ("Makefile", "makefile", "GNUmakefile")
MAKE = re.compile(r"(?<![\w./-])g?make(?![\w.-])")
LOADS_CODE = re.compile(r"\b(runpy\.|importlib\.|exec\s*\(\s*open\s*\(|__import__\s*\(|SourceFileLoader|spec_from_file)")


def imported_names(source: str) -> set[str]:
    """Top-level module names a Python file imports (`_imports`)."""
    return _imports(source)


def _imports(source: str) -> set[str]:
    """Top-level module names a Python file imports (syntax tree; a regex when it does not parse)."""
    try:
        tree = parse_python(source)  # (one parse at a time in the process: schemas/pysource.py)
    except (SyntaxError, ValueError):
        return set(re.findall(r"^\s*(?:from|import)\s+([A-Za-z_]\w*)", source, re.M))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def _is_code(path: str, executable: bool) -> bool:
    return executable or path.endswith(SCRIPT_SUFFIXES)


def tests_run_agent_code(tests: Iterable[FileSpec], test_command: str | None, workdir: str,
                         solved: dict[str, bool], elsewhere: Iterable[str] = ()) -> str:
    """`in_process`, `subprocess` or `no` (module docstring). `solved`: every file of the work dir after the
    reference solution, absolute path -> executable; `elsewhere`: files the reference solution changed outside
    the work dir (absolute paths; an executable of them is named by path or file name)."""
    tests = list(tests)
    root = workdir.rstrip("/") or "/"
    modules = set()
    for path in solved:
        rel = posixpath.relpath(path, root)
        if rel.startswith(".."):
            continue
        top = rel.split("/")[0]
        if "/" in rel:
            modules.add(top)  # a package (or folder a namespace import reaches)
        elif top.endswith(".py"):
            modules.add(top[:-3])
    texts = [t.content for t in tests] + ([test_command] if test_command else [])
    for t in tests:
        if t.path.endswith(".py") and (_imports(t.content) & modules or
                                       (LOADS_CODE.search(t.content) and root in t.content)):
            return "in_process"
    # a build file of the work dir that the tests' `make` reads runs the agent's recipes (`make check`)
    if any(posixpath.basename(p) in MAKEFILES for p in solved) and any(MAKE.search(text) for text in texts):
        return "subprocess"
    programs = [p for p, x in solved.items() if _is_code(p, x)]
    programs += [p for p in elsewhere if re.search(r"/s?bin/[^/]+$", p) or p.endswith(SCRIPT_SUFFIXES)]
    for path in programs:
        name = posixpath.basename(path)
        pattern = re.compile(rf"(?<![\w./-])(?:{re.escape(path)}|\./{re.escape(name)}|{re.escape(name)})(?![\w-])")
        if any(pattern.search(text) for text in texts):
            return "subprocess"
    return "no"
