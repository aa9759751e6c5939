"""Mutators: wrong states derived from the reference solution's final state (the test audit's attacks).

A mutator is a registration in `MUTATORS`: a name, the kinds of output file it applies to (`data`: a text
file of results, `code`: Python the reference wrote, `script`: a shell script it wrote, `binary`: a file
that is not UTF-8 text or is too large to rewrite) and a function from the output's content (and what the
audit knows: the instruction's inputs) to the mutated content, `None` when it does not apply to this
content. `DELETE` as the content means the file is removed. Every mutant is *wrong* by construction: it
changes what a sound test compares (a value, a row, a line, the code's behaviour), unless it is
`equivalent` (below), and then it is never run.

Equivalence (conservative, so a survivor is evidence, never a guess):
- the mutated bytes are the same as the original's, or the same once every line's whitespace is collapsed
  and blank lines are dropped (a whitespace-only change);
- both parse as JSON to the same value (object keys are unordered);
- `lines_reordered` when the instruction says the order is free (`any order`, `order does not matter`, …)
  and the mutant holds the same lines;
nothing else is equivalent: a survivor of any other mutant is a test that accepts a wrong answer.
Free text (`prose`: a file the instruction asks notes, a summary or an explanation in, see `free_text`) has no
one right content: it is only emptied or deleted.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from typing import Callable

from ...schemas.pysource import parse as parse_python

DELETE = object()  # the mutated "content" of a removed file
NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.(\d+))?(?![\w.])")
ORDER_FREE = re.compile(r"\b(in )?(any|arbitrary|no particular) order\b|\border (does not|doesn't|do not|don't) "
                        r"matter\b|\border is (free|not important|irrelevant)\b", re.I)
FREE_TEXT = re.compile(r"\b(notes?|summary|summari[sz]e|human-readable|free[- ]form|description|describe|explain|"
                       r"explanation|comments?|any text)\b", re.I)
STRUCTURED = (".json", ".jsonl", ".csv", ".tsv", ".yaml", ".yml", ".xml", ".toml", ".ini", ".conf", ".sql")
CODE_SUFFIXES = (".py",)
SCRIPT_SUFFIXES = (".sh", ".bash")
MAX_TEXT = 1 << 20  # larger outputs are only deleted or emptied (`binary`)


@dataclass(frozen=True)
class Inputs:
    """What a mutator may read besides the output: the instruction and the environment's untouched text inputs
    (path relative to the work dir -> content)."""

    instruction: str
    files: dict[str, str]


@dataclass(frozen=True)
class Mutator:
    name: str
    applies_to: tuple[str, ...]  # output classes: data, prose, code, script, binary
    what: str  # what it changes, as the survivor's report says it
    make: Callable[[str, str, Inputs], "str | bytes | object | None"]  # (path, content, inputs) -> mutated


MUTATORS: dict[str, Mutator] = {}


def register(m: Mutator) -> Mutator:
    if m.name in MUTATORS:
        raise ValueError(f"mutator {m.name!r} is registered twice")
    if not set(m.applies_to) <= {"data", "prose", "code", "script", "binary"}:
        raise ValueError(f"mutator {m.name!r}: unknown output class in {m.applies_to}")
    MUTATORS[m.name] = m
    return m


def free_text(path: str, instruction: str) -> bool:
    """Whether the instruction asks for prose in `path` (notes, a summary, an explanation: no one right text, so
    only an empty or missing file is wrong): a sentence naming its file name says so, and it is no structured
    format (STRUCTURED suffixes never are)."""
    name = path.rsplit("/", 1)[-1]
    if name.lower().endswith(STRUCTURED):
        return False
    return any(name in sentence and FREE_TEXT.search(sentence)
               for sentence in re.split(r"(?<=[.;!?])\s+|\n", instruction))


def output_class(path: str, content: bytes, instruction: str = "") -> str:
    """`binary` (not UTF-8, NUL bytes or over MAX_TEXT), `script`, `code`, `prose` (`free_text`) or `data`."""
    if len(content) > MAX_TEXT or b"\0" in content:
        return "binary"
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError:
        return "binary"
    if path.endswith(SCRIPT_SUFFIXES) or text.startswith("#!") and "python" not in text.split("\n", 1)[0]:
        return "script"
    if path.endswith(CODE_SUFFIXES) or text.startswith("#!") and "python" in text.split("\n", 1)[0]:
        return "code"
    return "prose" if free_text(path, instruction) else "data"


def _lines(text: str) -> tuple[list[str], str]:
    """Lines without their ends, and the end the text had ('\\n' or '')."""
    end = "\n" if text.endswith("\n") else ""
    return (text[:-1] if end else text).split("\n") if text else [], end


def _join(lines: list[str], end: str) -> str:
    return "\n".join(lines) + (end if lines else "")


def _perturb(match: re.Match) -> str:
    """A number moved by 10% of itself plus ten units of its last decimal: beyond any tolerance its precision allows."""
    text, decimals = match.group(0), len(match.group(1) or "")
    value = float(text)
    moved = value + abs(value) * 0.1 + 10 ** (1 - decimals) if decimals else int(value) + max(1, abs(int(value)) // 10 + 1)
    return f"{moved:.{decimals}f}" if decimals else str(moved)


def _cells(line: str) -> tuple[list[str], str] | None:
    for sep in ("\t", ": ", ",", ";", "|", " "):
        if sep in line:
            return line.split(sep), sep
    return None


def _core(cell: str) -> tuple[str, str]:
    """A cell's value and what trails it (whitespace, a JSON line's comma)."""
    core = cell.rstrip().rstrip(",").rstrip()
    return core, cell[len(core):]


def emptied(path, text, _):
    return ""


def deleted(path, text, _):
    return DELETE


def truncated(path, text, _):
    lines, end = _lines(text)
    return _join(lines[:len(lines) // 2], end) if len(lines) > 1 else text[:len(text) // 2]


def line_dropped(path, text, _):
    lines, end = _lines(text)
    body = [i for i, line in enumerate(lines) if line.strip()]
    return _join(lines[:body[-1]] + lines[body[-1] + 1:], end) if len(body) > 1 else None


def line_duplicated(path, text, _):
    lines, end = _lines(text)
    body = [i for i, line in enumerate(lines) if line.strip()]
    return _join(lines[:body[-1] + 1] + [lines[body[-1]]] + lines[body[-1] + 1:], end or "\n") if body else None


def line_added(path, text, _):
    """An extra line like the last one, its numbers moved (an item that must not be there)."""
    lines, end = _lines(text)
    body = [line for line in lines if line.strip()]
    if not body:
        return None
    extra = NUMBER.sub(_perturb, body[-1])
    if extra == body[-1]:
        extra = body[-1] + " extra"
    return _join(lines + [extra], "\n")


def lines_reordered(path, text, _):
    lines, end = _lines(text)
    body = [line for line in lines if line.strip()]
    if len(set(body)) < 2:
        return None
    return _join(list(reversed(body)), end)


def numbers_perturbed(path, text, _):
    """The numbers of the last line that has any, each moved beyond its precision."""
    lines, end = _lines(text)
    for i in range(len(lines) - 1, -1, -1):
        if NUMBER.search(lines[i]):
            return _join(lines[:i] + [NUMBER.sub(_perturb, lines[i])] + lines[i + 1:], end)
    return None


def values_swapped(path, text, _):
    """In the last two rows with the same number of cells, the last cell that differs, swapped (never the
    first cell, a row's key or name: swapping it would only reorder the rows)."""
    lines, end = _lines(text)
    rows = [(i, _cells(line)) for i, line in enumerate(lines) if line.strip()]
    rows = [(i, c) for i, c in rows if c]
    for (i, (a, sep)), (j, (b, sep2)) in zip(rows[-2::-1], rows[:0:-1]):
        if sep != sep2 or len(a) != len(b):
            continue
        for k in range(len(a) - 1, 0, -1):
            (va, ta), (vb, tb) = _core(a[k]), _core(b[k])  # a trailing comma stays where it was
            if va and vb and va != vb:
                a2, b2 = list(a), list(b)
                a2[k], b2[k] = vb + ta, va + tb
                out = list(lines)
                out[i], out[j] = sep.join(a2), sep.join(b2)
                return _join(out, end)
    return None


def inputs_echoed(path, text, inputs: Inputs):
    """The untouched input most like the output (same suffix first) copied over it."""
    if not inputs.files:
        return None
    suffix = path.rsplit(".", 1)[-1] if "." in path.rsplit("/", 1)[-1] else ""
    ranked = sorted(inputs.files, key=lambda p: (not p.endswith("." + suffix) if suffix else True, p))
    return inputs.files[ranked[0]]


class _Stub(ast.NodeTransformer):
    def __init__(self, body: Callable[[], list[ast.stmt]]):
        self.body = body

    def visit_FunctionDef(self, node):  # noqa: N802 (ast's naming)
        node.body = self.body()
        return node

    visit_AsyncFunctionDef = visit_FunctionDef  # noqa: N815


def _stubbed(text: str, body: Callable[[], list[ast.stmt]]) -> str | None:
    try:
        tree = parse_python(text)
    except (SyntaxError, ValueError):
        return None
    if not any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in ast.walk(tree)):
        return None
    return ast.unparse(_Stub(body).visit(tree)) + "\n"


def functions_return_constant(path, text, _):
    return _stubbed(text, lambda: [ast.Return(ast.Constant(0))])


def functions_do_nothing(path, text, _):
    return _stubbed(text, lambda: [ast.Pass()])


def script_exits_0(path, text, _):
    return "#!/bin/sh\nexit 0\n"


# the order is the audit's order of attack within a file (the budget takes the first ones of every output):
# what catches the commonest weak tests first (exists-only, substring, tolerance / format, set comparisons)
for _m in (
    Mutator("emptied", ("data", "prose", "code", "script", "binary"), "the file emptied", emptied),
    Mutator("line_added", ("data",), "an extra line added (like the last, numbers moved)", line_added),
    Mutator("numbers_perturbed", ("data",), "the numbers of one line moved beyond their precision", numbers_perturbed),
    Mutator("functions_return_constant", ("code",), "every function's body replaced by `return 0`",
            functions_return_constant),
    Mutator("script_exits_0", ("script",), "the script reduced to `exit 0`", script_exits_0),
    Mutator("line_duplicated", ("data",), "the last line duplicated", line_duplicated),
    Mutator("values_swapped", ("data",), "a value swapped between two rows", values_swapped),
    Mutator("functions_do_nothing", ("code",), "every function's body replaced by `pass`", functions_do_nothing),
    Mutator("line_dropped", ("data",), "the last line dropped", line_dropped),
    Mutator("truncated", ("data",), "the second half cut off", truncated),
    Mutator("lines_reordered", ("data",), "the lines in reverse order", lines_reordered),
    Mutator("inputs_echoed", ("data",), "an untouched input copied over the output", inputs_echoed),
    Mutator("deleted", ("data", "prose", "code", "script", "binary"), "the file deleted", deleted),
):
    register(_m)


def _squash(text: str) -> list[str]:
    return [" ".join(line.split()) for line in text.splitlines() if line.strip()]


def _same_json(a: str, b: str) -> bool:
    try:
        return json.loads(a) == json.loads(b)
    except ValueError:
        return False


def equivalent(mutator: str, original: str, mutated: str, inputs: Inputs) -> str | None:
    """Why `mutated` leaves the compared content the same as `original` (None: it does not; see the module
    docstring for the rule)."""
    if mutated == original:
        return "the same content"
    if _squash(mutated) == _squash(original):
        return "a whitespace-only change"
    if _same_json(original, mutated):
        return "the same JSON value (object keys in another order, or only layout changed)"
    if mutator == "lines_reordered" and ORDER_FREE.search(inputs.instruction) \
            and sorted(_squash(mutated)) == sorted(_squash(original)):
        return "the same lines, and the instruction says their order is free"
    return None
