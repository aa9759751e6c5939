"""The source text of code that runs inside a sandbox but is kept in real modules (ruff and the tests
read it): a tool environment's tools and helpers (tasks/envs/families/tool_code/) and its hidden checks
(`tools/checks.py`).

Invariant: the text, not the module object, is what goes into the image and the hidden tests, and so
into the environment's content hash and id: `source(fn)` is a function's lines as written,
`statements(module, first, last)` a run of a module's top-level statements as written (with a leading
newline, the shape of the string literals they replaced). Editing such a line changes every
environment that ships it, exactly as editing the literal did.
"""

from __future__ import annotations

import ast
import inspect
from types import ModuleType
from typing import Callable

from ....schemas.pysource import parse as parse_python


def source(fn: Callable) -> str:
    """The lines of `fn` as written in its module (ending with a newline)."""
    return inspect.getsource(fn)


def _name(node: ast.stmt) -> str | None:
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        return node.name
    if isinstance(node, ast.Assign):
        target = node.targets[0]
        return target.id if isinstance(target, ast.Name) else \
            next((e.id for e in getattr(target, "elts", []) if isinstance(e, ast.Name)), None)
    return None


def statements(module: ModuleType, first: str, last: str) -> str:
    """A newline, then the lines of `module`'s top-level statements from the one defining `first` to the
    one defining `last`, as written (blank lines and comments between them included)."""
    text = inspect.getsource(module)
    body = parse_python(text).body
    names = [_name(s) for s in body]
    try:
        i, j = names.index(first), names.index(last)
    except ValueError:
        raise ValueError(f"{module.__name__} defines no top-level {first!r} or {last!r}") from None
    lines = text.splitlines(keepends=True)
    return "\n" + "".join(lines[body[i].lineno - 1:body[j].end_lineno])
