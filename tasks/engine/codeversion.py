"""Code versions by meaning: a digest of the normalised syntax tree of every module that decides a
stage's output.

Which modules: the stage's module and its *import closure* inside the package, found statically
from each module's syntax tree (`import trajforge.x`, `from .x import y`, `from . import x` with `x` a
submodule, relative or absolute, at any depth, inside functions too; importing `a.b.c` runs the
`__init__` of `a` and `a.b`, so those count, and so does whatever they import: a registry filled by
its package's `__init__` is covered), plus a sibling module named as a file in a string (`"server.py"`:
a source shipped into the sandbox as data). The closure stops at the modules of `OPERATIONAL`: they are
left out and not descended through.

How: comments never reach the tree; docstrings (the first string statement of a module, class or
function) are removed; line and column numbers are not dumped. So reformatting, comments and
documentation keep every committed stage reusable, while any changed expression, name or constant
in a module of the closure changes its digest.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
import re
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterable

from ...schemas.pysource import parse as parse_python

PACKAGE = __package__.split(".")[0]  # "trajforge"

OPERATIONAL: dict[str, str] = {
    "tasks.sandbox.reaper": "removes the containers of builds whose process is gone: which containers "
                            "exist between builds, never what happens inside one",
    "tasks.engine.lease": "one live driver per build (lease file, heartbeat, takeover): who may write, "
                          "never what is written",
    "tasks.engine.identity": "which process owns a sandbox or a lease, and whether it still runs",
    "tasks.engine.progress": "live progress counters and their display while shards run",
    "tasks.engine.limits": "limits on concurrent holders (in-flight caps): how fast work is admitted",
    "tasks.sandbox.fleet": "a build's limits on sandbox creations per second and sandboxes alive, shared by "
                           "all workers: when a sandbox starts, never what happens in it",
    "tasks.teachers.vllm_server": "the vLLM process lifecycle: start, health, restart, stop",
    "tasks.teachers.cpu_profile": "threads, KV cache and compile cache of a CPU vLLM server (speed only); "
                                  "the dtype it resolves counts by its value (`VLLMTeacherConfig.fingerprint`)",
    "tasks.teachers.endpoints": "routing, in-flight limits and health of endpoints: how requests travel, "
                                "never what a teacher answers",
    "expectations": "the gate: it decides whether rows commit, never what they are; its effective suites "
                    "have their own hash (`runner.gate_hash`), kept out of the fingerprint",
}
"""Modules (names relative to the package; a package covers its submodules) that decide how a build
runs, never what its rows are: editing them reuses every committed stage. The value says why. A
stage's code closure neither includes nor descends through them; a module that decides rows must
never be listed here (`tests/test_architecture.py` checks both directions)."""


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return tree


def source_digest(source: str) -> str:
    """Digest of the meaning of Python `source` (see module docstring)."""
    return _tree_digest(parse_python(source))


def _tree_digest(tree: ast.Module) -> str:
    """`source_digest` of a parsed module (its docstrings are removed from `tree` on the way)."""
    tree = _strip_docstrings(tree)
    return hashlib.sha256(ast.dump(tree, annotate_fields=False, include_attributes=False).encode()).hexdigest()


def _root() -> Path:
    return Path(importlib.import_module(PACKAGE).__file__).parent


@lru_cache(maxsize=None)
def module_file(name: str) -> Path | None:
    """The source file of module `name` inside the package (found on disk, nothing is imported), or None."""
    parts = name.split(".")
    if parts[0] != PACKAGE:
        return None
    base = _root().joinpath(*parts[1:])
    for path in (base / "__init__.py", base.parent / f"{base.name}.py"):
        if path.is_file():
            return path
    return None


_SIBLING_FILE = re.compile(r"(?!__init__\.py$)[A-Za-z_][A-Za-z0-9_]*\.py")


def is_operational(name: str, operational: Iterable[str] | None = None) -> bool:
    for op in OPERATIONAL if operational is None else operational:
        full = f"{PACKAGE}.{op}"
        if name == full or name.startswith(full + "."):
            return True
    return False


def imported_modules(name: str, source: str) -> set[str]:
    """The package's modules that running module `name` (whose code is `source`) imports, anywhere in
    it, with the parent packages each import runs, and the sibling modules it names as a file (a
    source shipped as data: `Path(__file__).with_name("server.py")`). Other packages are left out."""
    return _imports_in(name, parse_python(source))


def _imports_in(name: str, tree: ast.Module) -> set[str]:
    """`imported_modules` of module `name` parsed as `tree` (left as it is)."""
    path = module_file(name)
    package = name if path is not None and path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                if node.level - 1 >= len(parts):
                    continue
                base = ".".join(parts[:len(parts) - (node.level - 1)])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            targets = [base] + [f"{base}.{a.name}" for a in node.names if a.name != "*"]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and path is not None \
                and _SIBLING_FILE.fullmatch(node.value) and (path.parent / node.value).is_file():
            targets = [f"{package}.{node.value[:-3]}"]
        for target in targets:
            parts = target.split(".")
            if parts[0] != PACKAGE:
                continue
            # `import a.b.c` runs a, a.b, a.b.c; `from a.b import c` runs c only if it is a module
            found.update(m for m in (".".join(parts[:i]) for i in range(1, len(parts) + 1)) if module_file(m))
    found.discard(name)
    return found


@lru_cache(maxsize=None)
def _file_facts(name: str) -> tuple[frozenset[str], str]:
    """(what it imports, its digest) of a module of the package with a file: one parse for both."""
    tree = parse_python(module_file(name).read_text())
    imports = frozenset(_imports_in(name, tree))  # (before the digest strips the tree's docstrings)
    return imports, _tree_digest(tree)


def _imports_of_file(name: str) -> frozenset[str]:
    return _file_facts(name)[0]


def closure(roots: Iterable[str], operational: Iterable[str] | None = None,
            source: Callable[[str], str] | None = None) -> list[str]:
    """The package's modules that importing `roots` runs, found statically and transitively, minus
    the `operational` ones (default `OPERATIONAL`), which are not descended through either. Sorted.
    A root outside the package is kept as it is (not descended into). `source(name)` gives a module's
    code (default: its file)."""
    imports = (lambda n: imported_modules(n, source(n))) if source else _imports_of_file
    seen: set[str] = set()
    todo = [r for r in roots if not is_operational(r, operational)]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if module_file(name) is None:
            continue
        todo += [m for m in imports(name) if m not in seen and not is_operational(m, operational)]
    return sorted(seen)


def module_source(name: str) -> str:
    path = module_file(name)
    return path.read_text() if path is not None else inspect.getsource(importlib.import_module(name))


@lru_cache(maxsize=None)
def module_digest(name: str) -> str:
    return _file_facts(name)[1] if module_file(name) is not None else source_digest(module_source(name))


def modules_digest(names: Iterable[str], digest: Callable[[str], str] = module_digest) -> str:
    """One short digest over the named modules (order-independent, duplicates ignored)."""
    h = hashlib.sha256()
    for name in sorted(set(names)):
        h.update(name.encode())
        h.update(digest(name).encode())
    return h.hexdigest()[:12]
