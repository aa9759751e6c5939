"""Python source is parsed and compiled one conversion at a time in the whole process (schemas/pysource.py):
CPython 3.11's AST converters keep their recursion depth in shared state, and two threads parsing at once failed
the tool-families test with "SystemError: AST constructor recursion depth mismatch"."""

from __future__ import annotations

import io
import tokenize
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OWN = ROOT / "schemas" / "pysource.py"


def _direct_conversions(path: Path, root: Path = ROOT) -> list[str]:
    """`ast.parse(` and builtin `compile(` calls in the code of `path` (string literals, such as the code a
    container runs, are not this process's code and are skipped by the tokenizer)."""
    toks = [t for t in tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
            if t.type in (tokenize.NAME, tokenize.OP)]
    found = []
    for i, t in enumerate(toks[:-1]):
        prev = toks[i - 1].string if i else ""
        if t.string == "parse" and prev == "." and i >= 2 and toks[i - 2].string == "ast" and toks[i + 1].string == "(":
            found.append(f"{path.relative_to(root)}:{t.start[0]}: ast.parse")
        if t.string == "compile" and prev != "." and prev != "def" and toks[i + 1].string == "(":
            found.append(f"{path.relative_to(root)}:{t.start[0]}: compile")
    return found


def test_every_parse_of_the_package_goes_through_the_one_lock():
    files = [p for d in ("tasks", "flows", "schemas", "expectations") for p in (ROOT / d).rglob("*.py") if p != OWN]
    found = [hit for p in files for hit in _direct_conversions(p)]
    assert not found, "parse through trajforge.schemas.pysource (one lock per process): " + "; ".join(found)


def test_the_scan_sees_a_direct_parse_and_skips_code_in_strings(tmp_path):
    planted = tmp_path / "m.py"
    planted.write_text('import ast, re\nSRC = "ast.parse(x); compile(y)"\nr = re.compile("a")\n'
                       "t = ast.parse('x = 1')\nc = compile('x', 'f', 'exec')\n")
    hits = [h.split(": ")[1] for h in _direct_conversions(planted, tmp_path)]
    assert hits == ["ast.parse", "compile"]


def test_parses_from_many_threads_give_the_same_trees():
    from trajforge.schemas.pysource import compile_code, parse

    source = "def f(x):\n" + "".join(f"    if x == {i}:\n        return [{i}, ({i}, {{'k': {i}}})]\n" for i in range(60))
    with ThreadPoolExecutor(8) as pool:
        dumps = set(pool.map(lambda _: __import__("ast").dump(parse(source)), range(64)))
        codes = list(pool.map(lambda _: compile_code(source, "<t>"), range(16)))
    assert len(dumps) == 1 and all(c.co_filename == "<t>" for c in codes)



def test_a_spurious_depth_mismatch_from_code_beside_ours_is_converted_again():
    """A library converting a tree in a thread of its own (outside the lock) can make one of ours fail with the
    converter's "recursion depth mismatch": that conversion runs again (`parse` and `compile_code` both go through
    `_retried`); any other SystemError, or a mismatch past the attempts, is raised as it came."""
    import ast

    import pytest

    from trajforge.schemas import pysource

    calls = []

    def flaky(source, filename):
        calls.append(filename)
        if len(calls) < 3:
            raise SystemError("AST constructor recursion depth mismatch (before=90, after=65)")
        return ast.parse(source, filename)

    tree = pysource._retried(flaky, "x = 1\n", "m.py")
    assert isinstance(tree.body[0], ast.Assign) and calls == ["m.py"] * 3

    # another SystemError at once; a mismatch every time after the last attempt
    for message, attempts in (("other", 1), ("AST constructor recursion depth mismatch (before=1, after=2)",
                                             pysource.ATTEMPTS)):
        def failing(*_, message=message):
            calls.append(message)
            raise SystemError(message)

        calls.clear()
        with pytest.raises(SystemError, match=message.split()[0]):
            pysource._retried(failing, "x = 1\n")
        assert calls == [message] * attempts
