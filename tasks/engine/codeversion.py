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

Cost: parsing and dumping the closure's trees is seconds of CPU in every cold process (a build's driver, each
`trajforge` command). What a file's text alone decides (its digest, the import targets it names) is kept in
`$TRAJFORGE_CACHE/codeversion/`, one JSON file per module text, keyed by the module's name, whether it is a package,
the SHA-256 of its bytes, the Python version and `FACTS_VERSION`; which of those targets exist as modules is
looked up on disk each time. A changed byte is a new key: a cached fact never outlives the text it was made from.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
import json
import os
import re
import sys
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterable

from ...schemas.pysource import parse as parse_python
from .cache import cache_root

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
    return _existing(name, *_import_targets(name, tree))


def _package_of(name: str) -> str:
    path = module_file(name)
    return name if path is not None and path.name == "__init__.py" else name.rpartition(".")[0]


def _import_targets(name: str, tree: ast.Module) -> tuple[list[str], list[str]]:
    """(the package's dotted names its imports name, the strings that look like a sibling module's file name):
    what the text alone says, before any look-up on disk."""
    package = _package_of(name)
    targets: set[str] = set()
    siblings: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                if node.level - 1 >= len(parts):
                    continue
                base = ".".join(parts[:len(parts) - (node.level - 1)])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            targets.update([base] + [f"{base}.{a.name}" for a in node.names if a.name != "*"])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _SIBLING_FILE.fullmatch(node.value):
            siblings.add(node.value)
    return sorted(t for t in targets if t.split(".")[0] == PACKAGE), sorted(siblings)


def _existing(name: str, targets: Iterable[str], siblings: Iterable[str]) -> set[str]:
    """The modules of the package that importing `targets` runs (with their parent packages: `import a.b.c` runs
    a, a.b, a.b.c; `from a.b import c` runs c only if it is a module), plus the `siblings` named as files that
    exist beside `name`'s file; `name` itself left out."""
    path = module_file(name)
    package = _package_of(name)
    found: set[str] = set()
    if path is not None:
        targets = [*targets, *(f"{package}.{s[:-3]}" for s in siblings if (path.parent / s).is_file())]
    for target in targets:
        parts = target.split(".")
        found.update(m for m in (".".join(parts[:i]) for i in range(1, len(parts) + 1)) if module_file(m))
    found.discard(name)
    return found


FACTS_VERSION = 1  # bump when `_import_targets` or `_tree_digest` changes what they compute


def _facts_dir() -> Path:
    return cache_root() / "codeversion"


@lru_cache(maxsize=None)
def _file_facts(name: str) -> tuple[frozenset[str], str]:
    """(what it imports, its digest) of a module of the package with a file: one parse for both, or none when
    the same text was parsed before (the cache of the module docstring)."""
    path = module_file(name)
    data = path.read_bytes()
    key = hashlib.sha256(f"{FACTS_VERSION}|{sys.version_info[:2]}|{name}|{path.name}|".encode() + data).hexdigest()
    cached = _facts_dir() / f"{key[:40]}.json"
    try:
        facts = json.loads(cached.read_text())
        targets, siblings, digest = facts["targets"], facts["siblings"], facts["digest"]
    except (OSError, ValueError, KeyError, TypeError):
        tree = parse_python(data)
        targets, siblings = _import_targets(name, tree)  # (before the digest strips the tree's docstrings)
        digest = _tree_digest(tree)
        _store_facts(cached, {"name": name, "targets": targets, "siblings": siblings, "digest": digest})
    return frozenset(_existing(name, targets, siblings)), digest


def _store_facts(path: Path, facts: dict) -> None:
    """Written whole or not at all (a rename); a cache that cannot be written is only slower."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(facts))
        os.replace(tmp, path)
    except OSError:
        pass


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
