"""What a commit task's instruction says of the change beyond its message (issue 43): the interface the commit adds
or alters, as its own documentation states it, and the project's change notes for it.

A commit's message alone ("9.1.0", "Fix #123") rarely says what to build, and the hidden tests check behaviour the
agent cannot see: a fair task states the wanted interface. `interface(before, after)` gives, for each public
top-level function or class of the changed `.py` files that is new or whose signature or docstring changed, its
signature and docstring (never its body: that is the reference solution). `change_notes(diff)` gives the lines the
commit adds to the project's changelog files (`CHANGES*`, `CHANGELOG*`, `HISTORY*`, `NEWS*`, `docs/versions.*`).

Invariants: deterministic (file order, then definition order); nothing of a test file is read; text that does not
parse is skipped (the instruction is then the message and the failing tests only); both are capped in length.
"""

from __future__ import annotations

import ast
import re
from pathlib import PurePosixPath

from ....schemas.pysource import parse

MAX_INTERFACE = 6000
MAX_NOTES = 2000
DOC_LINES = 25  # of one docstring
NOTES = re.compile(r"^(changes|changelog|history|news|versions|release[-_]?notes)(\.(rst|md|txt))?$", re.I)


def _definitions(source: bytes | None, path: str) -> dict[str, tuple[str, str]]:
    """Public top-level functions and classes of `source`: name -> (signature line, docstring)."""
    if source is None:
        return {}
    try:
        tree = parse(source, path)
    except (SyntaxError, ValueError):
        return {}
    out = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
            prefix = "async def" if isinstance(node, ast.AsyncFunctionDef) else "def"
            sig = f"{prefix} {node.name}({ast.unparse(node.args)})"
            if node.returns is not None:
                sig += f" -> {ast.unparse(node.returns)}"
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            bases = ", ".join(ast.unparse(b) for b in node.bases)
            sig = f"class {node.name}({bases})" if bases else f"class {node.name}"
        else:
            continue
        out[node.name] = (sig + ":", ast.get_docstring(node) or "")
    return out


def _stub(sig: str, doc: str) -> str:
    """A definition as a stub: its signature line, then its docstring (at most `DOC_LINES` lines) or `...`."""
    if not doc:
        return f"{sig}\n    ..."
    lines = doc.splitlines()
    if len(lines) > DOC_LINES:
        lines = lines[:DOC_LINES] + ["..."]
    lines = [line.replace('"""', '\\"\\"\\"') for line in lines]
    body = "\n".join(f"    {line}" if line.strip() else "" for line in lines)
    return f'{sig}\n    """{body[4:]}\n    """'


def interface(before: dict[str, bytes | None], after: dict[str, bytes | None]) -> str:
    """The signatures and docstrings the change adds or alters (path -> source before / after, None: absent), as
    Python stubs under a comment naming the file: new definitions first, then those whose signature changed, then
    those whose docstring alone changed (what the cap cuts first); "" when there are none."""
    levels: list[list[tuple[str, str]]] = [[], [], []]  # (path, stub) of new / signature changed / docstring changed
    for path in sorted(after):
        old, new = _definitions(before.get(path), path), _definitions(after[path], path)
        for name, (sig, doc) in new.items():
            if name not in old:
                levels[0].append((path, _stub(sig, doc)))
            elif old[name][0] != sig:
                levels[1].append((path, _stub(sig, doc)))
            elif old[name][1] != doc:
                levels[2].append((path, _stub(sig, doc)))
    parts, last = [], None
    for what, level in zip(("new", "changed", "documented anew"), levels):
        for path, stub in level:
            head = f"# {what} in {path}"
            parts.append(stub if head == last else f"{head}\n{stub}")
            last = head
    text = "\n\n".join(parts)
    return text if len(text) <= MAX_INTERFACE else text[:MAX_INTERFACE].rsplit("\n", 1)[0] + "\n# ... (more)"


def change_notes(diff: str) -> str:
    """The lines `diff` (a unified git diff) adds to the project's changelog files; "" when it adds none."""
    out: list[str] = []
    keep = False
    for line in diff.splitlines():
        if line.startswith("diff --git "):
            target = line.rsplit(" b/", 1)[-1]
            keep = bool(NOTES.match(PurePosixPath(target).name))
        elif keep and line.startswith("+") and not line.startswith("+++"):
            out.append(line[1:])
    text = "\n".join(out).strip("\n")
    return text if len(text) <= MAX_NOTES else text[:MAX_NOTES].rsplit("\n", 1)[0] + "\n..."
