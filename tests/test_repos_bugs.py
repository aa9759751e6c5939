"""Planted bugs (tasks/envs/repos/bugs.py): every operator on a small realistic module, the invariants every plant
keeps (parses, differs, a few lines, skipped regions untouched), patches through `git apply`, combine, sample."""

from __future__ import annotations

import ast
import difflib
import subprocess
import tokenize
from io import StringIO

import pytest

from trajforge.tasks.envs.repos.bugs import (
    OPERATORS,
    BugPlantingError,
    BugSet,
    Operator,
    Plant,
    combine,
    inverse_patch,
    patch,
    plant,
    register,
    sample,
)

PATH = "pkg/ranges.py"
MODULE = '''\
"""Parse and hold integer ranges like "1-3,7" (a fixture for planted bugs)."""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from collections.abc import Iterable

    def typed_only(value: int) -> bool:
        return value > 0

__all__ = ["RangeSet", "clamp", "parse_range"]

PATTERN = re.compile(r"^(\\d+)(?:-(\\d+))?$")
LIMIT = 100  # module level: never planted


def parse_range(text: str, limit: int = 100) -> list[int]:
    """Expand "1-3,7" into [1, 2, 3, 7]; a value above `limit` is an error."""
    values = []
    for part in text.split(","):  # parts are comma-separated
        part = part.strip()
        if not part:
            continue
        match = PATTERN.match(part)
        if match is None:
            raise ValueError(f"bad part {part!r} in {text!r}")
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) else low
        if low > high:
            raise ValueError(f"reversed range {part!r}")
        elif high > limit:
            raise ValueError(f"{high} is above {limit}")
        values.extend(range(low, high + 1))
    return values


def clamp(value: int, low: int, high: int) -> int:
    # keep `value` within [low, high]
    if value < low:
        return low
    if value >= high:
        return high
    return value


def bounded_total(values: list[int], limit: int) -> int:
    return clamp(sum(values), 0, limit)


def windows(items: list[int], size: int = 2) -> list[list[int]]:
    """Consecutive runs of `size` items."""
    return [items[i:i + size] for i in range(len(items) - size + 1)]


def sign_label(value: int) -> str:
    return "€ " + str(value) if value < 0 else "+" + str(value)


def speed(mode: Literal["fast", "slow"] = "fast") -> int:
    factor: Literal["x2", "x1"] = "x2" if mode == "fast" else "x1"
    return 2 if factor == "x2" else 1


class RangeSet:
    """A sorted set of integers, with a log of what was added."""

    def __init__(self, values: Iterable[int] = ()) -> None:
        self.values: list[int] = []
        self.log: list[tuple[str, int]] = []
        for value in values:
            self.add(value)

    def add(self, value: int) -> None:
        if value in self.values:
            return
        self.values.append(value)
        self.values.sort()  # the invariant: sorted
        self._note("add", value)

    def _note(self, what: str, value: int) -> None:
        self.log.append((what, value))

    def first(self) -> int | None:
        return self.values[0] if self.values else None

    def describe(self, sep: str = ", ") -> str:
        if not self.values:
            return "empty"
        else:
            # the values in order
            return sep.join(str(v) for v in self.values)

    def is_strict(self) -> bool:
        return False

    @functools.lru_cache(maxsize=32)  # noqa: B019
    def cached(self, n: int) -> int:
        return n * 2

    def kind(self) -> str:
        size = len(self.values)
        if size == 0:
            return "none"
        elif size == 1:
            return "one"
        else:
            return "many"


if __name__ == "__main__":
    def demo() -> None:
        print(parse_range("1-3,7"), clamp(12, 0, 10))

    demo()
'''


def load(source: str) -> dict:
    namespace: dict = {"__name__": "fixture"}
    exec(compile(source, PATH, "exec"), namespace)  # the fixture module, planted or not
    return namespace


def line_of(text: str, source: str = MODULE) -> int:
    [number] = [i for i, line in enumerate(source.split("\n"), 1) if text in line]
    return number


def find(plants: list[Plant], operator: str, *, description: str = "", mutated: str = "") -> Plant:
    found = [p for p in plants if p.operator == operator and description in p.description and mutated in p.mutated]
    assert len(found) == 1, (operator, description, mutated, [p.description for p in plants if p.operator == operator])
    return found[0]


def changed_lines(p: Plant) -> tuple[int, int]:
    """Lines removed and added."""
    diff = list(difflib.unified_diff(p.original.splitlines(), p.mutated.splitlines(), lineterm="", n=0))[2:]
    return sum(d.startswith("-") for d in diff), sum(d.startswith("+") for d in diff)


def comments(source: str) -> list[str]:
    return [t.string for t in tokenize.generate_tokens(StringIO(source).readline) if t.type == tokenize.COMMENT]


@pytest.fixture(scope="module")
def plants() -> list[Plant]:
    return plant(MODULE, PATH)


def test_the_registry_holds_the_six_operators_once_each():
    assert list(OPERATORS) == ["flipped_comparison", "off_by_one", "removed_branch", "swapped_arguments",
                               "changed_constant", "removed_call"]
    with pytest.raises(ValueError, match="registered twice"):
        register(Operator("off_by_one", "again", lambda src, node: iter(())))


def test_every_operator_plants_in_the_fixture_and_every_plant_keeps_the_invariants(plants):
    assert {p.operator for p in plants} == set(OPERATORS)
    assert len({p.mutated for p in plants}) == len(plants)  # no duplicates
    shape = ast.dump(ast.parse(MODULE))
    for p in plants:
        assert p.path == PATH and p.original == MODULE and p.mutated != MODULE
        assert ast.dump(ast.parse(p.mutated)) != shape, p.description  # parses, and not a change of layout only
        assert p.description.endswith(f" in `{p.function}` line {p.line}") and "\n" not in p.description
        removed, added = changed_lines(p)
        if p.operator != "removed_branch":
            assert removed <= 2 and added <= 2, p.description
        head = next(i for i, (a, b) in enumerate(zip(MODULE.split("\n"), p.mutated.split("\n")), 1) if a != b)
        assert head <= p.line <= head + removed, p.description  # the line named is the first one changed


def test_plant_is_deterministic():
    first, again = plant(MODULE, PATH), plant(MODULE, PATH)
    assert [(p.operator, p.line, p.description, p.mutated) for p in first] == \
           [(p.operator, p.line, p.description, p.mutated) for p in again]
    assert [p.line for p in first] == sorted(p.line for p in first)


def test_flipped_comparison_changes_what_clamp_returns(plants):
    p = find(plants, "flipped_comparison", description="`<` became `>=` in `clamp`")
    assert p.line == line_of("if value < low:")
    assert "    if value >= low:\n" in p.mutated and changed_lines(p) == (1, 1)
    assert load(MODULE)["clamp"](5, 0, 10) == 5
    assert load(p.mutated)["clamp"](5, 0, 10) == 0
    membership = find(plants, "flipped_comparison", description="`in` became `not in` in `RangeSet.add`")
    assert "if value not in self.values:" in membership.mutated
    identity = find(plants, "flipped_comparison", description="`is` became `is not`")
    assert "if match is not None:" in identity.mutated


def test_off_by_one_moves_a_range_bound_a_plus_one_and_a_slice(plants):
    p = find(plants, "off_by_one", mutated="values.extend(range(low, high))")
    assert p.description == f"`high + 1` became `high` in `parse_range` line {line_of('values.extend')}"
    assert load(MODULE)["parse_range"]("1-3,7") == [1, 2, 3, 7]
    assert load(p.mutated)["parse_range"]("1-3,7") == [1, 2]
    assert load(MODULE)["windows"]([1, 2, 3]) == [[1, 2], [2, 3]]
    lower = find(plants, "off_by_one", mutated="items[i + 1:i + size]")
    assert load(lower.mutated)["windows"]([1, 2, 3]) == [[2], [3]]
    upper = find(plants, "off_by_one", mutated="items[i:(i + size) - 1]")
    assert load(upper.mutated)["windows"]([1, 2, 3]) == [[1], [2]]
    stop = find(plants, "off_by_one", mutated="range(len(items) - size)]")
    assert load(stop.mutated)["windows"]([1, 2, 3]) == [[1, 2]]
    index = find(plants, "off_by_one", mutated="self.values[1] if")
    assert index.function == "RangeSet.first"


def test_removed_branch_drops_an_if_an_elif_and_keeps_an_else(plants):
    skip = find(plants, "removed_branch", description="`if not part:` branch removed")
    assert changed_lines(skip) == (2, 0)
    with pytest.raises(ValueError, match="bad part"):
        load(skip.mutated)["parse_range"]("1,,2")
    assert load(MODULE)["parse_range"]("1,,2") == [1, 2]

    limit = find(plants, "removed_branch", description="`elif high > limit:` branch removed")
    assert "raise ValueError(f\"reversed range {part!r}\")\n        values.extend" in limit.mutated
    assert load(limit.mutated)["parse_range"]("5-200")[-1] == 200
    with pytest.raises(ValueError, match="above"):
        load(MODULE)["parse_range"]("5-200")

    first = find(plants, "removed_branch", description="`if size == 0:` branch removed")
    assert "        if size == 1:\n            return \"one\"\n        else:" in first.mutated  # the elif became if
    assert load(first.mutated)["RangeSet"]().kind() == "many"

    kept_else = find(plants, "removed_branch", description="`if not self.values:` branch removed")
    assert "always runs" in kept_else.description
    assert "        # the values in order\n        return sep.join(str(v) for v in self.values)\n" in kept_else.mutated
    assert load(kept_else.mutated)["RangeSet"]().describe() == ""
    assert load(MODULE)["RangeSet"]().describe() == "empty"


def test_swapped_arguments_only_when_they_differ(plants):
    p = find(plants, "swapped_arguments", mutated="clamp(0, sum(values), limit)")
    assert "`sum(values)` and `0`" in p.description and p.function == "bounded_total"
    assert load(MODULE)["bounded_total"]([3, 4], 5) == 5
    assert load(p.mutated)["bounded_total"]([3, 4], 5) == 7
    source = "def f(a):\n    return g(a, a) + g(a,  a) + max(a, 1)\n"
    assert [q for q in plant(source, "m.py") if q.operator == "swapped_arguments"] == []


def test_changed_constant_flips_bools_moves_numbers_alters_strings(plants):
    strict = find(plants, "changed_constant", description="`False` became `True`")
    assert load(strict.mutated)["RangeSet"]().is_strict() is True
    empty = find(plants, "changed_constant", mutated='return "empt"')
    assert load(empty.mutated)["RangeSet"]().describe() == "empt"
    comma = find(plants, "changed_constant", mutated='text.split(";"):  # parts are comma-separated')
    with pytest.raises(ValueError, match="bad part"):
        load(comma.mutated)["parse_range"]("1,2")
    doubled = find(plants, "changed_constant", mutated="return n * 3")
    assert doubled.function == "RangeSet.cached"


def test_removed_call_drops_a_statement_or_leaves_pass(plants):
    sort = find(plants, "removed_call", description="`self.values.sort()` removed")
    assert changed_lines(sort) == (1, 0)
    assert load(sort.mutated)["RangeSet"]([3, 1, 2]).values == [3, 1, 2]
    note = find(plants, "removed_call", description="`self.log.append((what, value))` removed")
    assert "    def _note(self, what: str, value: int) -> None:\n        pass\n" in note.mutated
    assert load(note.mutated)["RangeSet"]([1]).log == []


def test_skipped_regions_are_never_planted(plants):
    module_lines = {line_of(t) for t in ("__all__", "PATTERN = ", "LIMIT = ", "if TYPE_CHECKING", "abc import")}
    main = line_of('if __name__ == "__main__":')
    docstrings = {line_of('"""Expand'), line_of('"""Consecutive'), line_of('"""A sorted')}
    signatures = {i for i, line in enumerate(MODULE.split("\n"), 1) if line.strip().startswith(("def ", "@"))}
    for p in plants:
        assert p.line not in module_lines | docstrings | signatures and p.line < main, p.description
        assert 'Literal["fast", "slow"] = "fast"' in p.mutated and 'factor: Literal["x2", "x1"]' in p.mutated
        assert 'f"bad part {part!r} in {text!r}"' in p.mutated or p.operator == "removed_branch"
    assert {p.function for p in plants}.isdisjoint({"typed_only", "demo"})
    speed = [p for p in plants if p.function == "speed"]
    assert speed and all('Literal["x2", "x1"]' in p.mutated for p in speed)  # the values change, not the hints


def test_comments_and_layout_elsewhere_are_untouched(plants):
    originals = comments(MODULE)
    for p in plants:
        if p.operator not in ("removed_branch", "removed_call"):
            assert comments(p.mutated) == originals, p.description
    p = find(plants, "flipped_comparison", description="`<` became `>=` in `sign_label`")
    assert 'return "€ " + str(value) if value >= 0 else "+" + str(value)' in p.mutated  # columns are UTF-8 bytes


def test_windows_line_ends_are_kept(plants):
    crlf = MODULE.replace("\n", "\r\n")
    planted = plant(crlf, PATH)
    assert [p.description for p in planted] == [p.description for p in plants]
    for p, q in zip(planted, plants):
        assert p.mutated.count("\n") == p.mutated.count("\r\n"), p.description  # `pass` lines too
        assert p.mutated.replace("\r\n", "\n") == q.mutated


def test_a_named_function_plants_only_there_and_an_unknown_one_is_an_error():
    method = plant(MODULE, PATH, "RangeSet.add")
    assert method and {p.function for p in method} == {"RangeSet.add"}
    assert {p.operator for p in method} >= {"flipped_comparison", "removed_branch", "removed_call"}
    with pytest.raises(BugPlantingError, match="no function 'RangeSet.missing'"):
        plant(MODULE, PATH, "RangeSet.missing")
    nested = "def outer(x):\n    def inner(y):\n        return y < 3\n    return inner(x)\n"
    assert [p.function for p in plant(nested, "m.py", "outer.inner")] == ["outer.inner"] * 2


def test_a_module_that_does_not_parse_is_named_with_its_path_and_line():
    with pytest.raises(BugPlantingError) as caught:
        plant("def ok():\n    return 1\n\ndef broken(:\n    pass\n", "pkg/broken.py")
    assert caught.value.path == "pkg/broken.py" and caught.value.line == 4
    assert str(caught.value).startswith("pkg/broken.py:4: does not parse")
    with pytest.raises(BugPlantingError, match="pkg/nul.py:2"):
        plant("x = 1\ny = 2\0\n", "pkg/nul.py")
    with pytest.raises(BugPlantingError, match="relative"):
        plant("x = 1\n", "/abs/m.py")


def git_apply(tmp_path, files: dict[str, str], diff: str) -> dict[str, str]:
    """The files after `git apply` of `diff` in a fresh repository holding them."""
    repo = tmp_path / "repo"
    if not repo.exists():
        subprocess.run(["git", "init", "-q", str(repo)], check=True)
    for path, text in files.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_bytes(text.encode())
    subprocess.run(["git", "apply", "-"], cwd=repo, input=diff.encode(), check=True, capture_output=True)
    return {path: (repo / path).read_bytes().decode() for path in files}


def test_patch_and_inverse_patch_round_trip_through_git_apply(plants, tmp_path):
    for name in OPERATORS:
        p = next(q for q in plants if q.operator == name)
        diff = patch(p)
        assert diff.startswith(f"diff --git a/{PATH} b/{PATH}\n--- a/{PATH}\n+++ b/{PATH}\n@@ ")
        assert git_apply(tmp_path, {PATH: MODULE}, diff) == {PATH: p.mutated}, p.description
        assert git_apply(tmp_path, {PATH: p.mutated}, inverse_patch(p)) == {PATH: MODULE}, p.description


def test_patches_apply_to_a_file_without_a_final_newline(tmp_path):
    source = "def f(x):\n    # the last line is the bug\n    return x < 1"
    [p] = [q for q in plant(source, "m.py") if q.operator == "flipped_comparison"]
    assert p.mutated == "def f(x):\n    # the last line is the bug\n    return x >= 1"
    assert "\\ No newline at end of file" in patch(p)
    assert git_apply(tmp_path, {"m.py": source}, patch(p)) == {"m.py": p.mutated}
    assert git_apply(tmp_path, {"m.py": p.mutated}, inverse_patch(p)) == {"m.py": source}


def test_combine_plants_in_one_file_and_in_two(plants, tmp_path):
    a = find(plants, "flipped_comparison", description="`<` became `>=` in `clamp`")
    b = find(plants, "removed_call", description="`self.values.sort()` removed")
    both = combine([a, b])
    assert isinstance(both, BugSet) and len(both.changes) == 1 and both.plants == (a, b)
    [change] = both.changes
    assert "if value >= low:" in change.mutated and "self.values.sort()" not in change.mutated
    module = load(change.mutated)
    assert module["clamp"](5, 0, 10) == 0 and module["RangeSet"]([2, 1]).values == [2, 1]
    assert git_apply(tmp_path, {PATH: MODULE}, patch(both)) == {PATH: change.mutated}

    other = "def twice(x):\n    return x * 2\n"
    [c] = [q for q in plant(other, "pkg/other.py") if q.operator == "changed_constant"]
    three = combine([c, a, b])
    assert [ch.path for ch in three.changes] == ["pkg/other.py", PATH] and "pkg/other.py: " in three.description
    files = {PATH: MODULE, "pkg/other.py": other}
    planted = git_apply(tmp_path, files, patch(three))
    assert planted == {PATH: change.mutated, "pkg/other.py": c.mutated}
    assert git_apply(tmp_path, planted, inverse_patch(three)) == files


def test_combine_refuses_overlapping_plants_naming_them(plants):
    on_one_line = [p for p in plants if p.line == line_of("return clamp(sum(values), 0, limit)")]
    assert len(on_one_line) >= 2
    with pytest.raises(BugPlantingError, match="overlapping plants") as caught:
        combine(on_one_line[:2])
    assert on_one_line[0].description in str(caught.value) and on_one_line[1].description in str(caught.value)
    branch = find(plants, "removed_branch", description="`elif high > limit:` branch removed")
    inside = find(plants, "flipped_comparison", description="`>` became `<=` in `parse_range`", mutated="high <= limit")
    with pytest.raises(BugPlantingError, match="overlapping"):
        combine([inside, branch])
    with pytest.raises(BugPlantingError, match="different versions"):
        combine([plant("def f(x):\n    return x < 1\n", "m.py")[0], plant("def f(x):\n    return x > 1\n", "m.py")[0]])


def test_combine_refuses_plants_that_empty_a_block_together():
    source = "def f(log):\n    log.open()\n    log.close()\n"
    calls = [p for p in plant(source, "m.py") if p.operator == "removed_call"]
    assert len(calls) == 2 and all(ast.parse(p.mutated) for p in calls)
    with pytest.raises(BugPlantingError, match="do not parse"):
        combine(calls)


def test_sample_is_seeded_and_spreads_over_function_and_operator(plants):
    groups = {(p.path, p.function, p.operator) for p in plants}
    picked = sample(plants, 10, seed=7)
    assert picked == sample(plants, 10, seed=7)
    assert len(picked) == 10 and len({(p.path, p.function, p.operator) for p in picked}) == 10
    assert any(sample(plants, 10, seed=s) != picked for s in range(1, 5))
    spread = sample(plants, len(groups), seed=3)
    assert {(p.path, p.function, p.operator) for p in spread} == groups
    everything = sample(plants, len(plants) + 5, seed=3)
    assert len(everything) == len(plants) and {id(p) for p in everything} == {id(p) for p in plants}
    assert sample(plants, 0, seed=1) == []
