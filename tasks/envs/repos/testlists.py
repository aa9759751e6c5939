"""The hidden test lists of a repository task (issue 43), from the outcomes of its test runs, and their reward.

- `parse_junit(xml_text)`: node id -> outcome from pytest's JUnit XML (either family; `project.test_command` asks
  for xunit1, whose `file` attribute makes the mapping exact). A node id is as pytest prints it:
  `tests/sub/test_x.py::TestC::TestInner::test_y[1.5-a[b]]`; a module that failed to collect is its path
  (`tests/test_x.py`, an `error`). Without a `file` attribute the module is read from the dotted `classname`: the
  longest prefix that is a file of `files` when given, else everything before its trailing capitalized parts (the
  classes), so a folder with a dot in its name (`tests/v1.2/`) needs `files`. A node id reported twice keeps its
  worst outcome (`error` > `failed` > `passed` > `skipped`); xfail is `skipped`, a non-strict xpass `passed`.
  "" is {}; a report that does not parse, has another root or declares a DOCTYPE or ENTITY raises `JUnitError`.
- `flaky(runs)`: the tests whose outcome differs between runs of one tree (absent from a run counts as an outcome);
  the set `lists` excludes is the union of the flaky tests of the tree before and of the tree after.
- `lists(before, after, cap, seed, flaky=...)`: fail_to_pass = `failed`/`error`/absent before and `passed` after;
  pass_to_pass = `passed` in both, a seeded sample of at most `cap`; pass_to_fail = `passed` before and
  `failed`/`error` after (kept for the record: the commit breaks them). A test skipped in either run, or flaky, is in
  none of them. Every list is sorted; the same input and seed give the same lists.
- `rejection(lists)`: why a candidate is dropped upstream, the first of `REJECTIONS` that applies: `flaky_suite`
  (more than `max_flaky_share` of the tests seen are flaky: no outcome of the suite can be trusted),
  `no_fail_to_pass` (nothing fails before and passes after, flaky tests excluded: no task to solve).
- `reward(lists, outcomes)`: SWE-style, 1.0 when every fail_to_pass and every pass_to_pass test passed, else 0.0
  (and 0.0 for lists with no fail_to_pass: never a vacuous 1.0); with node id -> outcome for each of them, `missing`
  where the run did not report it.
"""

from __future__ import annotations

import random
import re
import xml.etree.ElementTree as ET
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

Outcome = Literal["passed", "failed", "error", "skipped"]
Result = Literal["passed", "failed", "error", "skipped", "missing"]
SEVERITY = {"skipped": 0, "passed": 1, "failed": 2, "error": 3}
BROKEN = frozenset({"failed", "error"})
REJECTIONS = ("flaky_suite", "no_fail_to_pass")
MAX_FLAKY_SHARE = 0.1


class JUnitError(ValueError):
    """A report that is not pytest's JUnit XML (does not parse, another root, a DOCTYPE or entity)."""


@dataclass(frozen=True)
class TestLists:
    __test__ = False  # not a pytest test class

    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]  # the sample
    pass_to_fail: tuple[str, ...]
    flaky: tuple[str, ...]  # the flaky tests among those seen before or after, excluded from every list
    seen: int  # distinct tests before or after
    pass_to_pass_total: int  # before sampling


def _dotted(path: str) -> str:
    """A file path as pytest writes it into `classname`."""
    return re.sub(r"\.py$", "", path.replace("/", "."))


def _module(classname: str, file: str | None, modules: dict[str, str]) -> tuple[str, str]:
    """(module path, the rest of `classname`: its classes, dotted)."""
    for path in ([file] if file else []):
        dotted = _dotted(path)
        if classname == dotted or classname.startswith(dotted + "."):
            return path, classname[len(dotted) + 1:]
    parts = classname.split(".")
    for k in range(len(parts), 0, -1):
        if ".".join(parts[:k]) in modules:
            return modules[".".join(parts[:k])], ".".join(parts[k:])
    k = len(parts)
    while k > 1 and parts[k - 1][:1].isupper():
        k -= 1
    return "/".join(parts[:k]) + ".py", ".".join(parts[k:])


def node_id(classname: str, name: str, file: str | None = None, modules: dict[str, str] | None = None) -> str:
    """The node id pytest printed for a test case of its JUnit report."""
    if not classname:  # a collection error: `name` is the dotted module
        path, _ = _module(name, file, modules or {})
        return path
    path, classes = _module(classname, file, modules or {})
    return "::".join([path, *(classes.split(".") if classes else []), name])


def _outcome(case: ET.Element) -> Outcome:
    tags = {child.tag for child in case}
    return "error" if "error" in tags else "failed" if "failure" in tags else "skipped" if "skipped" in tags \
        else "passed"


def parse_junit(xml_text: str, files: Iterable[str] | None = None) -> dict[str, Outcome]:
    """Node id -> outcome of every test case in a pytest JUnit report; "" (or only blanks) is {}.

    `files`: the tree's file paths (relative, `/`), to read module paths out of `classname` exactly."""
    if not xml_text.strip():
        return {}
    if re.search(r"<!(DOCTYPE|ENTITY)", xml_text, re.IGNORECASE):
        raise JUnitError("not a JUnit report: a DOCTYPE or ENTITY declaration")
    try:
        root = ET.fromstring(xml_text)
    except ET.ParseError as e:
        raise JUnitError(f"JUnit report does not parse at line {e.position[0]}: {e}") from e
    if root.tag not in ("testsuites", "testsuite"):
        raise JUnitError(f"not a JUnit report: root <{root.tag}>")
    modules = {_dotted(f): f for f in files or ()}
    out: dict[str, Outcome] = {}
    for case in root.iter("testcase"):
        name = case.get("name")
        if not name:
            raise JUnitError("a <testcase> with no name")
        key = node_id(case.get("classname") or "", name, case.get("file"), modules)
        outcome = _outcome(case)
        if key not in out or SEVERITY[outcome] > SEVERITY[out[key]]:
            out[key] = outcome
    return out


def flaky(runs: Sequence[Mapping[str, str]]) -> set[str]:
    """The tests whose outcome is not the same in every run (absent from a run is an outcome of its own)."""
    tests = set().union(*runs) if runs else set()
    return {t for t in tests if len({run.get(t, "missing") for run in runs}) > 1}


def lists(before: Mapping[str, str], after: Mapping[str, str], pass_to_pass_cap: int | None, seed: int, *,
          flaky: Collection[str]) -> TestLists:
    """The task's test lists from one run before and one after (see the module's rules); `flaky` is required so that
    no caller forgets it: pass `set()` when the runs were not repeated."""
    if pass_to_pass_cap is not None and pass_to_pass_cap < 0:
        raise ValueError(f"pass_to_pass_cap must be None or >= 0, not {pass_to_pass_cap}")
    seen = set(before) | set(after)
    excluded = seen & set(flaky)
    kept = sorted(seen - excluded)
    f2p = [t for t in kept if after.get(t) == "passed" and before.get(t, "failed") in BROKEN]
    p2p = [t for t in kept if after.get(t) == "passed" and before.get(t) == "passed"]
    p2f = [t for t in kept if before.get(t) == "passed" and after.get(t) in BROKEN]
    sample = p2p if pass_to_pass_cap is None or len(p2p) <= pass_to_pass_cap \
        else sorted(random.Random(seed).sample(p2p, pass_to_pass_cap))
    return TestLists(tuple(f2p), tuple(sample), tuple(p2f), tuple(sorted(excluded)), len(seen), len(p2p))


def rejection(test_lists: TestLists, max_flaky_share: float = MAX_FLAKY_SHARE) -> str | None:
    """The reason (one of `REJECTIONS`) a candidate with these lists is rejected, or None when it is kept."""
    if test_lists.seen and len(test_lists.flaky) / test_lists.seen > max_flaky_share:
        return "flaky_suite"
    if not test_lists.fail_to_pass:
        return "no_fail_to_pass"
    return None


def reward(test_lists: TestLists, outcomes: Mapping[str, str]) -> tuple[float, dict[str, Result]]:
    """(1.0 or 0.0, node id -> outcome of every fail_to_pass and pass_to_pass test, `missing` when not run)."""
    results: dict[str, Result] = {t: outcomes.get(t, "missing") for t in (*test_lists.fail_to_pass,
                                                                           *test_lists.pass_to_pass)}
    solved = bool(test_lists.fail_to_pass) and all(r == "passed" for r in results.values())
    return (1.0 if solved else 0.0), results
