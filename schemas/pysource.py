"""Python source to syntax trees and code objects, one conversion at a time in the whole process.

CPython 3.11 keeps the AST converters' recursion depth in per-interpreter state, not per thread: two threads
parsing at once (`ast.parse`, `compile` of source or of a tree) can fail with "SystemError: AST constructor
recursion depth mismatch" (gh-106905; seen here when families were generated and environments validated in
thread pools). Every parse and compile of trajforge goes through this module's one lock; the trees returned
are plain objects, safe to walk in any thread. Code that is not trajforge's (a library parsing in a thread of its
own) can still convert a tree beside ours: that error is spurious (the converter resets its depth at each start),
so a conversion that meets it is run again, up to `ATTEMPTS` times.
"""

from __future__ import annotations

import ast
import threading
from types import CodeType

_LOCK = threading.Lock()
ATTEMPTS = 5
MISMATCH = "recursion depth mismatch"


def _retried(convert, *args):
    """`convert(*args)` under the lock, run again after a spurious depth mismatch; the last attempt's error stands."""
    for _ in range(ATTEMPTS - 1):
        try:
            with _LOCK:
                return convert(*args)
        except SystemError as err:
            if MISMATCH not in str(err):
                raise
    with _LOCK:
        return convert(*args)


def parse(source: str | bytes, filename: str = "<unknown>") -> ast.Module:
    """`ast.parse(source, filename)` under the process-wide lock (SyntaxError / ValueError as ast raises them)."""
    return _retried(ast.parse, source, filename)


def compile_code(source: str | ast.Module, filename: str, mode: str = "exec") -> CodeType:
    """`compile(source, filename, mode)` of source text or a tree, under the same lock."""
    return _retried(compile, source, filename, mode)
