"""Python source to syntax trees and code objects, one conversion at a time in the whole process.

CPython 3.11 keeps the AST converters' recursion depth in per-interpreter state, not per thread: two threads
parsing at once (`ast.parse`, `compile` of source or of a tree) can fail with "SystemError: AST constructor
recursion depth mismatch" (gh-106905; seen here when families were generated and environments validated in
thread pools). Every parse and compile of trajforge goes through this module's one lock; the trees returned
are plain objects, safe to walk in any thread.
"""

from __future__ import annotations

import ast
import threading
from types import CodeType

_LOCK = threading.Lock()


def parse(source: str | bytes, filename: str = "<unknown>") -> ast.Module:
    """`ast.parse(source, filename)` under the process-wide lock (SyntaxError / ValueError as ast raises them)."""
    with _LOCK:
        return ast.parse(source, filename)


def compile_code(source: str | ast.Module, filename: str, mode: str = "exec") -> CodeType:
    """`compile(source, filename, mode)` of source text or a tree, under the same lock."""
    with _LOCK:
        return compile(source, filename, mode)
