"""Planted bugs: one small wrong edit of a function in a Python module, and the patches that plant and fix it.

An operator is a registration in `OPERATORS`: a name, what it changes, and a function from one AST node of a
function's body to its candidate edits (`flipped_comparison`, `off_by_one`, `removed_branch`,
`swapped_arguments`, `changed_constant`, `removed_call`). `plant(source, path)` lists every candidate of every
operator in the module, in a deterministic order (by line, then column, then the registry's order).

Every plant guarantees:
- it is inside a function (or method; `function` is its dotted name, `Class.method`, `outer.inner`): code at
  module or class level (constants, `__all__`) is never planted, nor docstrings and bare strings, type
  annotations, decorators, default values, f-strings, `if __name__ == "__main__":` and `if TYPE_CHECKING:`
  blocks (and the functions defined in them);
- `mutated` is `original` with only the changed node's source replaced (or, for a removed branch or call, only
  its lines removed or dedented): comments, quotes and layout elsewhere are untouched, so the diff is a few lines;
- `mutated` parses, and its AST differs from the original's (a change of layout only is never a bug);
- no two plants of one `plant` call have the same `mutated` (the first in the order above keeps it: of two
  operators making one change at one place, the one registered first);
- `patch` plants it and `inverse_patch` (the reference solution) removes it: unified diffs with git's `a/`
  and `b/` paths that apply with `git apply` or `patch -p1`.
Plants are candidates, not bugs yet: whether a test sees one is the caller's to find out (an equivalent
mutant, e.g. a constant no code path reads, survives every test and is dropped there).

Input: `source` is text (decoding the file's bytes, and rejecting what is not UTF-8, is the caller's job;
strip a byte-order mark first); line ends `\\n` or `\\r\\n`; `path` is relative to the repository root with `/`
separators. A module that does not parse raises `BugPlantingError` naming the path and the line.
"""

from __future__ import annotations

import ast
import difflib
import math
import random
import re
from dataclasses import dataclass, field
from typing import Callable, Iterator, NamedTuple, Sequence

from ....schemas.pysource import parse as parse_python

FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
SKIPPED_FIELDS = {"annotation", "returns", "decorator_list", "type_comment", "type_params"}
COMMUTATIVE = {"max", "min"}  # calls whose swapped arguments mean the same
FLIPS: dict[type, tuple[str, str]] = {
    ast.Lt: ("<", ">="), ast.GtE: (">=", "<"), ast.LtE: ("<=", ">"), ast.Gt: (">", "<="),
    ast.Eq: ("==", "!="), ast.NotEq: ("!=", "=="), ast.Is: ("is", "is not"), ast.IsNot: ("is not", "is"),
    ast.In: ("in", "not in"), ast.NotIn: ("not in", "in"),
}
CHAR_SWAPS = {",": ";", ";": ",", ":": "=", "=": ":", " ": "", "\n": " ", "\t": " ", ".": ",", "-": "_", "_": "-"}


class BugPlantingError(ValueError):
    """A module that cannot be planted in (it does not parse, no such function) or plants that cannot be combined."""

    def __init__(self, path: str, line: int | None, reason: str):
        self.path, self.line, self.reason = path, line, reason
        super().__init__(f"{path}:{line}: {reason}" if line else f"{path}: {reason}")


@dataclass(frozen=True)
class Change:
    """One file of a patch: its path and its text before and after."""

    path: str
    original: str = field(repr=False)
    mutated: str = field(repr=False)


@dataclass(frozen=True)
class Plant:
    """One planted bug; `description` is one line, e.g. "`<` became `>=` in `parse_range` line 42"."""

    path: str
    operator: str
    function: str
    line: int
    description: str
    original: str = field(repr=False)
    mutated: str = field(repr=False)

    @property
    def changes(self) -> tuple[Change, ...]:
        return (Change(self.path, self.original, self.mutated),)


@dataclass(frozen=True)
class BugSet:
    """Several plants combined (one file or several): `changes` holds one `Change` per file, in path order."""

    plants: tuple[Plant, ...]
    changes: tuple[Change, ...]

    @property
    def description(self) -> str:
        return "; ".join(f"{p.path}: {p.description}" for p in self.plants)


class Edit(NamedTuple):
    start: int  # character offsets in the source
    end: int
    text: str


class Candidate(NamedTuple):
    line: int
    edits: tuple[Edit, ...]
    what: str  # the description before " in `function` line N"


class Source:
    """The module's text with the AST's positions (lines from 1, columns in UTF-8 bytes) as character offsets."""

    def __init__(self, text: str, tree: ast.Module):
        self.text, self.lines = text, text.split("\n")
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line) + 1)
        self.blocks = {id(s): block for node in ast.walk(tree) for block in _blocks(node) for s in block}

    def offset(self, line: int, col: int) -> int:
        return self.starts[line - 1] + len(self.lines[line - 1].encode()[:col].decode())

    def span(self, node: ast.AST) -> tuple[int, int]:
        return self.offset(node.lineno, node.col_offset), self.offset(node.end_lineno, node.end_col_offset)

    def segment(self, node: ast.AST) -> str:
        start, end = self.span(node)
        return self.text[start:end]

    def line_span(self, first: int, last: int) -> tuple[int, int]:
        """Lines `first`..`last` whole, with their line ends."""
        return self.starts[first - 1], min(self.starts[last], len(self.text))

    def indent(self, line: int) -> str:
        text = self.lines[line - 1]
        return text[:len(text) - len(text.lstrip())]

    def alone(self, node: ast.AST) -> bool:
        """Whether the statement has its lines to itself (a comment may trail it)."""
        start, end = self.span(node)
        before = self.text[self.starts[node.lineno - 1]:start]
        after = self.text[end:self.starts[node.end_lineno] - 1]
        return not before.strip() and (not after.strip() or after.strip().startswith("#"))


@dataclass(frozen=True)
class Operator:
    name: str
    what: str
    find: Callable[[Source, ast.AST], Iterator[Candidate]]


OPERATORS: dict[str, Operator] = {}


def register(op: Operator) -> Operator:
    if op.name in OPERATORS:
        raise ValueError(f"bug operator {op.name!r} is registered twice")
    OPERATORS[op.name] = op
    return op


# --- what is planted and what is not ---------------------------------------------------------------------------

def _blocks(node: ast.AST) -> Iterator[list[ast.stmt]]:
    for _, value in ast.iter_fields(node):
        if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
            yield value
        elif isinstance(value, list) and value and isinstance(value[0], (ast.excepthandler, ast.match_case)):
            yield from (item.body for item in value)


def _is_name(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name or isinstance(node, ast.Attribute) and node.attr == name


def _skipped(node: ast.AST) -> bool:
    if isinstance(node, (*FUNCTIONS, ast.ClassDef, ast.JoinedStr)):
        return True  # functions are planted on their own; class-level code never; f-strings' parts have no positions
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
        return True  # a docstring or a bare string
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        return any(_is_name(t, "__all__") for t in getattr(node, "targets", [getattr(node, "target", None)]))
    if isinstance(node, ast.If):
        test = node.test
        return _is_name(test, "TYPE_CHECKING") or isinstance(test, ast.Compare) and len(test.ops) == 1 and \
            isinstance(test.ops[0], ast.Eq) and {ast.dump(test.left), ast.dump(test.comparators[0])} == \
            {ast.dump(ast.Name("__name__", ast.Load())), ast.dump(ast.Constant("__main__"))}
    return False


def functions(body: list[ast.stmt], prefix: str = "") -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """The functions and methods of a module (nested ones too), with their dotted names, in source order."""
    for stmt in body:
        if isinstance(stmt, FUNCTIONS):
            yield prefix + stmt.name, stmt
            yield from functions(stmt.body, f"{prefix}{stmt.name}.")
        elif isinstance(stmt, ast.ClassDef):
            yield from functions(stmt.body, f"{prefix}{stmt.name}.")
        elif not _skipped(stmt):
            for block in _blocks(stmt):
                yield from functions(block, prefix)


def _walk(node: ast.AST) -> Iterator[ast.AST]:
    if _skipped(node):
        return
    yield node
    for name, value in ast.iter_fields(node):
        if name not in SKIPPED_FIELDS:
            for child in value if isinstance(value, list) else [value]:
                if isinstance(child, ast.AST):
                    yield from _walk(child)


def owned(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> Iterator[ast.AST]:
    """The nodes of a function's body that are its own (not a nested function's), minus the skipped ones."""
    for stmt in fn.body:
        yield from _walk(stmt)


# --- the operators -----------------------------------------------------------------------------------------------

def _short(text: str, width: int = 40) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[:width - 1] + "…"


def _int_literal(node: ast.AST | None) -> int | None:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
        return -node.operand.value if type(node.operand.value) is int else None
    return None


def _replaced(src: Source, node: ast.AST, text: str, what: str) -> Candidate:
    return Candidate(node.lineno, (Edit(*src.span(node), text),), what)


def flipped_comparison(src: Source, node: ast.AST) -> Iterator[Candidate]:
    if not isinstance(node, ast.Compare):
        return
    operands = [node.left, *node.comparators]
    for op, before, after in zip(node.ops, operands, operands[1:]):
        old, new = FLIPS[type(op)]
        start, end = src.span(before)[1], src.span(after)[0]
        gap = re.sub(r"#[^\n]*", lambda m: " " * len(m.group()), src.text[start:end])  # no strings in a gap
        found = re.search(r"(?<![\w<>=!])" + r"\s+".join(map(re.escape, old.split())) + r"(?![\w<>=])", gap)
        if found:
            edit = Edit(start + found.start(), start + found.end(), new)
            yield Candidate(after.lineno, (edit,), f"`{old}` became `{new}`")


def _bound(src: Source, node: ast.AST | None, stop: bool) -> Iterator[Candidate]:
    """A range's or slice's start moved up by one, its stop down by one (a literal away from zero)."""
    if node is None or isinstance(node, ast.BinOp) and _int_literal(node.right) == 1:
        return  # `x + 1` / `x - 1` is `off_by_one`'s own case below
    value, text = _int_literal(node), src.segment(node)
    if value is not None:
        new = str(value + 1 if value >= 0 else value - 1)
    else:
        atomic = isinstance(node, (ast.Name, ast.Attribute, ast.Call, ast.Subscript))
        new = f"{text if atomic else f'({text})'} {'-' if stop else '+'} 1"
    yield _replaced(src, node, new, f"`{_short(text)}` became `{_short(new)}`")


def off_by_one(src: Source, node: ast.AST) -> Iterator[Candidate]:
    if isinstance(node, ast.Call) and _is_name(node.func, "range") and not node.keywords \
            and 1 <= len(node.args) <= 3 and not any(isinstance(a, ast.Starred) for a in node.args):
        if len(node.args) == 1:
            yield from _bound(src, node.args[0], stop=True)
        else:
            yield from _bound(src, node.args[0], stop=False)
            yield from _bound(src, node.args[1], stop=True)
    elif isinstance(node, ast.Slice):
        yield from _bound(src, node.lower, stop=False)
        yield from _bound(src, node.upper, stop=True)
    elif isinstance(node, ast.Subscript) and _int_literal(node.slice) is not None:
        yield from _bound(src, node.slice, stop=False)
    elif isinstance(node, ast.Compare):
        for operand in [node.left, *node.comparators]:
            if _int_literal(operand) is not None:
                yield from _bound(src, operand, stop=False)
    elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)) and _int_literal(node.right) == 1:
        start, end = src.span(node)
        left_end = src.span(node.left)[1]  # the left operand with its parentheses, if any
        close = re.match(r"[\s)]*", src.text[left_end:end]).group().rstrip()
        kept = src.text[start:left_end] + close
        yield Candidate(node.lineno, (Edit(start, end, kept),),
                        f"`{_short(src.text[start:end])}` became `{_short(kept)}`")


def _else_line(src: Source, node: ast.If) -> int | None:
    """The line of the `else:` of an `if` that has one (not an `elif`)."""
    for line in range(node.body[-1].end_lineno + 1, node.orelse[0].lineno + 1):
        if re.match(r"else\s*:", src.lines[line - 1].strip()) and src.indent(line) == src.indent(node.lineno):
            return line
    return None


def _is_elif(src: Source, node: ast.AST) -> bool:
    return isinstance(node, ast.If) and src.lines[node.lineno - 1].encode()[node.col_offset:].startswith(b"elif")


def _dedented(src: Source, node: ast.If, else_line: int) -> str | None:
    """The `else:` body's lines at the `if`'s indentation; None when that is not a safe textual edit."""
    first = node.orelse[0]
    if first.lineno == else_line or any(isinstance(n, (ast.Constant, ast.JoinedStr)) and n.lineno != n.end_lineno
                                        for s in node.orelse for n in ast.walk(s)):
        return None  # a body on the `else:` line, or a multi-line string whose text would change
    inner, outer = src.indent(first.lineno), src.indent(node.lineno)
    lines = src.text[slice(*src.line_span(else_line + 1, node.end_lineno))].split("\n")
    out = []
    for line in lines:
        if line.startswith(inner):
            out.append(outer + line[len(inner):])
        elif line.strip() and not line.strip().startswith("#"):
            return None
        else:
            out.append(line)
    return "\n".join(out)


def _removed_lines(src: Source, node: ast.stmt, last: int, keep_block: bool = True) -> Edit:
    """The statement's lines (to `last`) removed; `pass` in their place when it is its block's only statement."""
    start, end = src.line_span(node.lineno, last)
    if not keep_block or len(src.blocks[id(node)]) > 1:
        return Edit(start, end, "")
    removed = src.text[start:end]
    return Edit(start, end, src.indent(node.lineno) + "pass" + removed[len(removed.rstrip("\r\n")):])


def removed_branch(src: Source, node: ast.AST) -> Iterator[Candidate]:
    if not isinstance(node, ast.If):
        return
    what = f"the `{_short(src.lines[node.lineno - 1].strip())}` branch removed"
    clause_end = node.body[-1].end_lineno  # comments before the next `elif` / `else:` stay
    if _is_elif(src, node):  # the next `elif` / `else:` follows the previous clause
        yield Candidate(node.lineno, (_removed_lines(src, node, clause_end, keep_block=False),), what)
    elif not node.orelse:
        yield Candidate(node.lineno, (_removed_lines(src, node, node.end_lineno),), what)
    elif _is_elif(src, nxt := node.orelse[0]):  # `if a: A elif b: B` becomes `if b: B`
        keyword = src.offset(nxt.lineno, nxt.col_offset)
        yield Candidate(node.lineno, (_removed_lines(src, node, clause_end, keep_block=False),
                                      Edit(keyword, keyword + len("elif"), "if")), what)
    elif (else_line := _else_line(src, node)) and (body := _dedented(src, node, else_line)) is not None:
        start, end = src.line_span(node.lineno, node.end_lineno)
        yield Candidate(node.lineno, (Edit(start, end, body),), what + " (its `else:` body always runs)")


def swapped_arguments(src: Source, node: ast.AST) -> Iterator[Candidate]:
    if not isinstance(node, ast.Call) or any(_is_name(node.func, name) for name in COMMUTATIVE):
        return
    for a, b in zip(node.args, node.args[1:]):
        if isinstance(a, ast.Starred) or isinstance(b, ast.Starred):
            continue
        ta, tb = src.segment(a), src.segment(b)
        if ta.strip() != tb.strip():
            edits = (Edit(*src.span(a), tb), Edit(*src.span(b), ta))
            yield Candidate(a.lineno, edits, f"the arguments `{_short(ta, 30)}` and `{_short(tb, 30)}` of "
                                             f"`{_short(src.segment(node.func), 30)}(…)` swapped")


def _altered(value: str | bytes) -> str | bytes:
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    if len(text) == 1:
        text = CHAR_SWAPS.get(text, chr(ord(text) + 1) if text.isprintable() and text < "\x7f" else " ")
    else:
        text = text[:-1]
    return text.encode("latin-1") if isinstance(value, bytes) else text


def _literal(value: object, like: str) -> str:
    """`value` as a literal, with the double quotes `like` (the literal it replaces) used, when it can."""
    text = repr(value)
    if like.lstrip("rRbBuU").startswith('"') and text.endswith("'") and '"' not in text:
        quote = text.index("'")
        text = text[:quote] + '"' + text[quote + 1:-1] + '"'
    return text


def changed_constant(src: Source, node: ast.AST) -> Iterator[Candidate]:
    if not isinstance(node, ast.Constant) or node.lineno != node.end_lineno:
        return
    value, old = node.value, src.segment(node)
    if isinstance(value, bool):
        new = str(not value)
    elif isinstance(value, int):
        new = str({0: 1, 1: 0}.get(value, value + 1))
    elif isinstance(value, float) and math.isfinite(value):
        new = repr(value + 1.0 if value + 1.0 != value else value * 2 or 1.0)
    elif isinstance(value, (str, bytes)) and value:
        new = _literal(_altered(value), old)
    else:
        return
    yield _replaced(src, node, new, f"`{_short(old)}` became `{_short(new)}`")


def removed_call(src: Source, node: ast.AST) -> Iterator[Candidate]:
    if not isinstance(node, ast.Expr):
        return
    if not isinstance(node.value.value if isinstance(node.value, ast.Await) else node.value, ast.Call):
        return
    what = f"the call `{_short(src.segment(node))}` removed"
    if src.alone(node):
        yield Candidate(node.lineno, (_removed_lines(src, node, node.end_lineno),), what)
    elif len(src.blocks[id(node)]) == 1:
        yield _replaced(src, node, "pass", what)


# the order decides which operator names a change two of them make (a range bound's `0` → `1` is an off-by-one)
for _op in (
    Operator("flipped_comparison", "a comparison negated (`<` ↔ `>=`, `==` ↔ `!=`, `in` ↔ `not in`, …)",
             flipped_comparison),
    Operator("off_by_one", "a range or slice bound, an index, a compared integer or a `± 1` moved by one", off_by_one),
    Operator("removed_branch", "an `if` or `elif` clause removed (an `else:` body kept)", removed_branch),
    Operator("swapped_arguments", "two adjacent positional arguments of a call swapped", swapped_arguments),
    Operator("changed_constant", "a constant changed (True ↔ False, 0 ↔ 1, n → n + 1, a string altered)",
             changed_constant),
    Operator("removed_call", "a call statement removed", removed_call),
):
    register(_op)


# --- planting, combining, sampling, patches --------------------------------------------------------------------

def _parse(source: str, path: str) -> ast.Module:
    if (cr := re.search(r"\r(?!\n)", source)) is not None:
        raise BugPlantingError(path, source.count("\n", 0, cr.start()) + 1, "a carriage return without a line feed")
    try:
        return parse_python(source, filename=path)
    except SyntaxError as e:
        line = e.lineno or (source.count("\n", 0, source.index("\0")) + 1 if "\0" in source else None)
        raise BugPlantingError(path, line, f"does not parse: {e.msg}") from e


def _apply(text: str, edits: Sequence[Edit]) -> str:
    for edit in sorted(edits, reverse=True):
        text = text[:edit.start] + edit.text + text[edit.end:]
    return text


def _dump(code: str) -> str | None:
    try:
        return ast.dump(parse_python(code))
    except (SyntaxError, ValueError):
        return None


def plant(source: str, path: str, function: str | None = None) -> list[Plant]:
    """Every candidate bug of the module at `path` (or of the one function named `function`, e.g. `Class.method`).

    A candidate is checked on its function's lines alone (an indented one under `if 1:`): every edit is inside
    them, and a `def` starts its line, so they parse in the module when they parse alone."""
    if path.startswith("/") or ".." in path.split("/"):
        raise BugPlantingError(path, None, "the path must be relative to the repository root")
    tree = _parse(source, path)
    src = Source(source, tree)
    found = [(qual, fn) for qual, fn in functions(tree.body) if function in (None, qual)]
    if function is not None and not found:
        raise BugPlantingError(path, None, f"no function {function!r} (outside the skipped blocks)")
    ranked = []
    for qual, fn in found:
        for node in owned(fn):
            for rank, op in enumerate(OPERATORS.values()):
                for c in op.find(src, node):
                    ranked.append((c.line, min(e.start for e in c.edits), rank, qual, fn, op.name, c))
    plants, seen, shapes = [], set(), {}
    for line, _, _, qual, fn, name, c in sorted(ranked, key=lambda r: r[:3]):
        start, end = src.line_span(fn.lineno, fn.end_lineno)
        wrap = "if 1:\n" if fn.col_offset else ""
        before = source[start:end]
        after = _apply(before, [Edit(e.start - start, e.end - start, e.text) for e in c.edits])
        if id(fn) not in shapes:
            shapes[id(fn)] = _dump(wrap + before)
        if (start, after) in seen or _dump(wrap + after) in (None, shapes[id(fn)]):
            continue  # a change another operator made, one that does not parse, or one of layout only
        seen.add((start, after))
        mutated = source[:start] + after + source[end:]
        plants.append(Plant(path, name, qual, line, f"{c.what} in `{qual}` line {line}", source, mutated))
    return plants


def _lines(text: str) -> list[str]:
    return re.findall(r"[^\n]*\n|[^\n]+\Z", text)


def _hunk(original: str, mutated: str) -> tuple[int, int, list[str]]:
    """The changed lines: `original`'s lines [start, end) become the returned ones."""
    a, b = _lines(original), _lines(mutated)
    head = 0
    while head < min(len(a), len(b)) and a[head] == b[head]:
        head += 1
    tail = 0
    while tail < min(len(a), len(b)) - head and a[-1 - tail] == b[-1 - tail]:
        tail += 1
    return head, len(a) - tail, b[head:len(b) - tail]


def combine(plants: Sequence[Plant]) -> BugSet:
    """Several plants as one bug set: plants of one path must come from the same source and not touch the same
    lines (a `BugPlantingError` names the two that do); the combined module must still parse."""
    if not plants:
        raise BugPlantingError("-", None, "no plants to combine")
    changes = []
    for path in sorted({p.path for p in plants}):
        mine = [p for p in plants if p.path == path]
        if len({p.original for p in mine}) > 1:
            raise BugPlantingError(path, None, "the plants to combine come from different versions of the file")
        hunks = sorted((_hunk(p.original, p.mutated), i) for i, p in enumerate(mine))
        for n, ((s1, e1, _), i) in enumerate(hunks):
            for (s2, e2, _), j in hunks[n + 1:]:
                if s2 < e1 or s1 == s2:
                    raise BugPlantingError(path, mine[i].line, f"overlapping plants: {mine[i].description} and "
                                                               f"{mine[j].description}")
        lines = _lines(mine[0].original)
        for (start, end, new), _ in reversed(hunks):
            lines[start:end] = new
        mutated = "".join(lines)
        try:
            parse_python(mutated)
        except (SyntaxError, ValueError) as e:
            raise BugPlantingError(path, e.lineno, "the combined plants do not parse: "
                                   + "; ".join(p.description for p in mine)) from e
        changes.append(Change(path, mine[0].original, mutated))
    return BugSet(tuple(plants), tuple(changes))


def sample(plants: Sequence[Plant], k: int, seed: int | str) -> list[Plant]:
    """`k` plants (all of them when fewer) drawn with `seed`: one per (path, function, operator) first, the rest
    only when there are fewer such groups than `k`. The same plants, `k` and seed give the same sample."""
    if k < 0:
        raise ValueError(f"k must be at least 0, not {k}")
    rng = random.Random(seed)
    groups: dict[tuple[str, str, str], list[Plant]] = {}
    for p in plants:
        groups.setdefault((p.path, p.function, p.operator), []).append(p)
    firsts = [rng.choice(g) for g in groups.values()]
    rng.shuffle(firsts)
    chosen = {id(p) for p in firsts}
    rest = [p for p in plants if id(p) not in chosen]
    rng.shuffle(rest)
    return (firsts + rest)[:k]


def _diff(path: str, before: str, after: str) -> str:
    out = [f"diff --git a/{path} b/{path}\n"]
    for line in difflib.unified_diff(_lines(before), _lines(after), f"a/{path}", f"b/{path}"):
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def patch(bug: Plant | BugSet) -> str:
    """The unified diff that plants the bug(s) (`git apply`, `patch -p1`)."""
    return "".join(_diff(c.path, c.original, c.mutated) for c in bug.changes)


def inverse_patch(bug: Plant | BugSet) -> str:
    """The unified diff that fixes the bug(s): the reference solution of a planted-bug task."""
    return "".join(_diff(c.path, c.mutated, c.original) for c in bug.changes)
