"""The safety check of model-written code, shared by every kind's LLM synthesis: what it may import and
call, by where it runs.

- hidden tests and checks (`unsafe_tests`) run as root in the verifier: they may read and compare, and
  run the agent's programs only through `run_as_agent`; nothing the agent wrote may be imported;
- tool code and helpers (`unsafe_tool_code`) run as the agent inside the sandbox, without network: plain
  data manipulation over `db` (the tool server's SQLite authorizer bounds its SQL anyway).

Each returns why the code is unsafe (`line N: ...`), or None; the caller makes it a reject.
"""

from __future__ import annotations

import ast

from ....schemas.pysource import parse as parse_python

# What hidden tests written by a model may import: reading and checking, nothing that runs code.
SAFE_IMPORTS = {"json", "os", "pathlib", "re", "math", "csv", "hashlib", "collections", "itertools", "datetime",
                "string", "textwrap", "statistics", "fractions", "decimal", "functools", "operator", "sqlite3",
                "configparser", "tomllib", "difflib", "unicodedata", "base64", "struct"}
UNSAFE_CALLS = {"system", "popen", "spawnl", "spawnv", "spawnve", "spawnlp", "execv", "execve", "execl", "execlp",
                "execvp", "startfile", "fork", "forkpty", "exec", "eval", "compile", "__import__", "import_module",
                "run_path", "run_module", "load_module", "exec_module", "chdir"}


def unsafe_tests(src: str) -> str | None:
    """Why model-written hidden tests could run agent-controlled code as root, or None. They run in
    the root test runner: the agent's programs must go through `run_as_agent`, and nothing the agent
    wrote may be imported (module names are looked up from the work dir the agent owns)."""
    tree = parse_python(src)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or "."]
            for n in names:
                if node.__class__ is ast.ImportFrom and node.level:
                    return f"line {node.lineno}: relative import"
                if n.split(".")[0] not in SAFE_IMPORTS:
                    return f"line {node.lineno}: imports {n!r} (allowed: {', '.join(sorted(SAFE_IMPORTS))})"
        elif isinstance(node, ast.Call):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
            if name in UNSAFE_CALLS:
                return f"line {node.lineno}: calls {name}() (run agent programs with run_as_agent)"
        elif isinstance(node, ast.Attribute) and node.attr in ("path", "modules", "meta_path") and \
                isinstance(node.value, ast.Name) and node.value.id == "sys":
            return f"line {node.lineno}: touches sys.{node.attr}"
        elif isinstance(node, ast.Name) and node.id in ("subprocess", "sys", "importlib", "runpy", "ctypes"):
            return f"line {node.lineno}: uses {node.id}"
    return None



# What model-written tool code may import: data manipulation only (the store is the `db` argument).
TOOL_IMPORTS = {"json", "re", "datetime", "math", "decimal", "fractions", "statistics", "collections", "itertools",
                "functools", "operator", "string", "textwrap", "difflib", "unicodedata", "hashlib", "sqlite3",
                "calendar", "bisect", "heapq", "enum", "dataclasses", "typing", "copy"}
# builtins that run code, open files or reach around names; methods that run programs or load code
BANNED_BUILTINS = {"exec", "eval", "compile", "__import__", "open", "getattr", "setattr", "delattr", "globals",
                   "locals", "vars", "breakpoint", "input", "exit", "quit"}
BANNED_METHODS = (UNSAFE_CALLS - {"compile"}) | {
    "enable_load_extension", "load_extension", "backup", "executescript", "connect", "set_authorizer",
    "set_progress_handler", "set_trace_callback", "setlimit", "create_function", "create_aggregate",
    "create_window_function", "create_collation", "serialize", "deserialize", "blobopen", "iterdump", "interrupt"}
TOOL_UNSAFE_NAMES = {"os", "sys", "subprocess", "builtins", "__builtins__", "importlib", "ctypes", "socket",
                     "shutil", "pathlib", "io"}


def unsafe_tool_code(src: str) -> str | None:
    """Why model-written tool code is more than data manipulation over `db`, or None."""
    tree = parse_python(src)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if isinstance(node, ast.ImportFrom) and node.level:
                return f"line {node.lineno}: relative import"
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or "."]
            for n in names:
                if n.split(".")[0] not in TOOL_IMPORTS:
                    return f"line {node.lineno}: imports {n!r} (allowed: {', '.join(sorted(TOOL_IMPORTS))})"
            banned = [a.name for a in node.names if a.name in BANNED_METHODS | BANNED_BUILTINS]
            if isinstance(node, ast.ImportFrom) and banned:
                return f"line {node.lineno}: imports {banned[0]}"
        elif isinstance(node, ast.Call):
            fn = node.func
            if isinstance(fn, ast.Name) and fn.id in BANNED_BUILTINS or \
                    isinstance(fn, ast.Attribute) and fn.attr in BANNED_METHODS:
                return f"line {node.lineno}: calls {fn.id if isinstance(fn, ast.Name) else fn.attr}()"
        elif isinstance(node, ast.Attribute) and (node.attr.startswith("__") or node.attr in BANNED_METHODS):
            return f"line {node.lineno}: touches {node.attr}"  # also an alias such as `c = sqlite3.connect`
        elif isinstance(node, ast.Name) and (node.id in TOOL_UNSAFE_NAMES or node.id in BANNED_BUILTINS - {"input", "vars"}):
            return f"line {node.lineno}: uses {node.id}"  # also an alias such as `f = open`
    return None


