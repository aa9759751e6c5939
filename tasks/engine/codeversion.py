"""Code versions by meaning: a digest of each module's normalised syntax tree.

Comments never reach the tree; docstrings (the first string statement of a module, class or
function) are removed; line and column numbers are not dumped. So reformatting, comments and
documentation keep every committed stage reusable, while any changed expression, name or constant
in a fingerprinted module changes its digest.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
from functools import lru_cache


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
    tree = _strip_docstrings(ast.parse(source))
    return hashlib.sha256(ast.dump(tree, annotate_fields=False, include_attributes=False).encode()).hexdigest()


@lru_cache(maxsize=None)
def module_digest(name: str) -> str:
    return source_digest(inspect.getsource(importlib.import_module(name)))


def modules_digest(names: list[str]) -> str:
    """One short digest over the named modules (order-independent, duplicates ignored)."""
    h = hashlib.sha256()
    for name in sorted(set(names)):
        h.update(name.encode())
        h.update(module_digest(name).encode())
    return h.hexdigest()[:12]
