"""Hidden test lists (tasks/envs/repos/testlists.py): node ids from pytest 9's JUnit XML of both families (classes,
nested classes, parameters with dots, brackets and `::`, a folder with a dot, a module that does not import),
fail-to-pass / pass-to-pass / pass-to-fail, flaky tests, rejections and the SWE-style reward."""

from __future__ import annotations

import pytest

from trajforge.tasks.envs.repos.testlists import (
    REJECTIONS,
    JUnitError,
    TestLists,
    flaky,
    lists,
    node_id,
    parse_junit,
    rejection,
    reward,
)

# What pytest 9.2 wrote for a small suite (`-o junit_family=...`; failure texts shortened): tests/sub/test_a.py has
# a class with a parametrized method and a nested class, a skip, an xfail and a fixture error; tests/v1.2 is a folder
# with a dot holding a unittest case; tests/test_broken.py does not import (`--continue-on-collection-errors`).
XUNIT2 = """<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests"><testsuite name="pytest" \
errors="2" failures="1" skipped="2" tests="9" time="0.198" timestamp="2026-11-28T06:51:38.322248+00:00" hostname="vm">\
<testcase classname="" name="tests.test_broken" time="0.000"><error message="collection failure">ImportError while \
importing test module '/tmp/jx/tests/test_broken.py'.
E   ModuleNotFoundError: No module named 'nope'</error></testcase>
<testcase classname="tests.sub.test_a.TestC" name="test_y[1.5]" time="0.001" />
<testcase classname="tests.sub.test_a.TestC" name="test_y[a[b]]" time="0.005" />
<testcase classname="tests.sub.test_a.TestC" name="test_y[p::q]" time="0.002"><failure message="AssertionError: \
assert 'p::q' != 'p::q'">tests/sub/test_a.py:6: in test_y
E   AssertionError</failure></testcase>
<testcase classname="tests.sub.test_a.TestC.TestInner" name="test_z" time="0.001" />
<testcase classname="tests.sub.test_a" name="test_skip" time="0.001"><skipped type="pytest.skip" message="no">\
/tmp/jx/tests/sub/test_a.py:13: no</skipped></testcase>
<testcase classname="tests.sub.test_a" name="test_xf" time="0.001"><skipped type="pytest.xfail" message="" />\
</testcase>
<testcase classname="tests.sub.test_a" name="test_err" time="0.001"><error message="failed on setup with \
&quot;RuntimeError: x&quot;">RuntimeError: x</error></testcase>
<testcase classname="tests.v1.2.test_dots.Case" name="test_u" time="0.001" /></testsuite></testsuites>"""
XUNIT1 = """<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests"><testsuite name="pytest" \
errors="2" failures="1" skipped="2" tests="9" time="0.088" timestamp="2026-11-28T06:51:40.040539+00:00" hostname="vm">\
<testcase classname="" name="tests.test_broken" file="tests/test_broken.py" time="0.000"><error message="collection \
failure">E   ModuleNotFoundError: No module named 'nope'</error></testcase>
<testcase classname="tests.sub.test_a.TestC" name="test_y[1.5]" file="tests/sub/test_a.py" line="3" time="0.001" />
<testcase classname="tests.sub.test_a.TestC" name="test_y[a[b]]" file="tests/sub/test_a.py" line="3" time="0.001" />
<testcase classname="tests.sub.test_a.TestC" name="test_y[p::q]" file="tests/sub/test_a.py" line="3" time="0.001">\
<failure message="AssertionError: assert 'p::q' != 'p::q'">E   AssertionError</failure></testcase>
<testcase classname="tests.sub.test_a.TestC.TestInner" name="test_z" file="tests/sub/test_a.py" line="8" \
time="0.000" />
<testcase classname="tests.sub.test_a" name="test_skip" file="tests/sub/test_a.py" line="11" time="0.000"><skipped \
type="pytest.skip" message="no">/tmp/jx/tests/sub/test_a.py:13: no</skipped></testcase>
<testcase classname="tests.sub.test_a" name="test_xf" file="tests/sub/test_a.py" line="14" time="0.000"><skipped \
type="pytest.xfail" message="" /></testcase>
<testcase classname="tests.sub.test_a" name="test_err" file="tests/sub/test_a.py" line="22" time="0.000"><error \
message="failed on setup with &quot;RuntimeError: x&quot;">RuntimeError: x</error></testcase>
<testcase classname="tests.v1.2.test_dots.Case" name="test_u" file="tests/v1.2/test_dots.py" line="2" \
time="0.001" /></testsuite></testsuites>"""
EXPECTED = {  # what `pytest --collect-only -q` printed for the same suite, with each test's outcome
    "tests/test_broken.py": "error",
    "tests/sub/test_a.py::TestC::test_y[1.5]": "passed",
    "tests/sub/test_a.py::TestC::test_y[a[b]]": "passed",
    "tests/sub/test_a.py::TestC::test_y[p::q]": "failed",
    "tests/sub/test_a.py::TestC::TestInner::test_z": "passed",
    "tests/sub/test_a.py::test_skip": "skipped",
    "tests/sub/test_a.py::test_xf": "skipped",
    "tests/sub/test_a.py::test_err": "error",
    "tests/v1.2/test_dots.py::Case::test_u": "passed",
}
FILES = ["tests/test_broken.py", "tests/sub/test_a.py", "tests/v1.2/test_dots.py", "pkg/__init__.py"]


def test_xunit1_reports_map_to_node_ids_exactly():
    assert parse_junit(XUNIT1) == EXPECTED


def test_xunit2_reports_need_the_tree_files_only_for_a_folder_with_a_dot():
    assert parse_junit(XUNIT2, files=FILES) == EXPECTED
    guessed = parse_junit(XUNIT2)
    assert {k: v for k, v in guessed.items() if "v1" not in k} == {k: v for k, v in EXPECTED.items() if "v1" not in k}
    assert "tests/v1/2/test_dots.py::Case::test_u" in guessed  # the documented limit without `files`


def test_node_ids_of_doctests_nested_classes_and_inherited_tests():
    assert node_id("pkg.mod", "pkg.mod.Cls.meth", "pkg/mod.py") == "pkg/mod.py::pkg.mod.Cls.meth"
    assert node_id("pkg.mod", "pkg.mod.func") == "pkg/mod.py::pkg.mod.func"
    assert node_id("tests.test_x.TestA.TestB", "test_q[x.y-[1]]") == "tests/test_x.py::TestA::TestB::test_q[x.y-[1]]"
    # an inherited test's `file` is its base class's module: the classname decides
    assert node_id("tests.test_child.TestChild", "test_base", "tests/base.py") == \
        "tests/test_child.py::TestChild::test_base"
    assert node_id("README.rst", "README.rst", "README.rst") == "README.rst::README.rst"


def test_empty_reports_and_a_test_reported_twice():
    assert parse_junit("") == {} and parse_junit("  \n") == {}
    assert parse_junit('<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests" />') == {}
    twice = ('<testsuite><testcase classname="tests.test_a" name="test_x" />'
             '<testcase classname="tests.test_a" name="test_x"><failure message="teardown" /></testcase>'
             '<testcase classname="tests.test_a" name="test_s"><skipped /></testcase>'
             '<testcase classname="tests.test_a" name="test_s" /></testsuite>')
    assert parse_junit(twice) == {"tests/test_a.py::test_x": "failed", "tests/test_a.py::test_s": "passed"}


@pytest.mark.parametrize("text, words", [
    ("<testsuites><testsuite>", "does not parse at line 1"),
    ("not xml at all", "does not parse"),
    ("<html><body/></html>", "root <html>"),
    ('<!DOCTYPE x [<!ENTITY a "aaaa">]><testsuites/>', "DOCTYPE"),
    ('<testsuites><testsuite><testcase classname="a" /></testsuite></testsuites>', "no name"),
])
def test_a_report_that_is_not_junit_is_a_named_error(text, words):
    with pytest.raises(JUnitError, match=words.replace("[", r"\[")):
        parse_junit(text)


BEFORE = {"t.py::new_test": "failed", "t.py::fixed": "error", "t.py::same": "passed", "t.py::also": "passed",
          "t.py::broken_by_it": "passed", "t.py::skipped_before": "skipped", "t.py::skip_after": "passed",
          "t.py::still_failing": "failed", "t.py::removed": "passed"}
AFTER = {"t.py::new_test": "passed", "t.py::fixed": "passed", "t.py::same": "passed", "t.py::also": "passed",
         "t.py::broken_by_it": "failed", "t.py::skipped_before": "passed", "t.py::skip_after": "skipped",
         "t.py::still_failing": "failed", "t.py::added": "passed"}


def test_lists_from_one_run_before_and_one_after():
    got = lists(BEFORE, AFTER, None, 0, flaky=set())
    assert got.fail_to_pass == ("t.py::added", "t.py::fixed", "t.py::new_test")  # absent before counts as failing
    assert got.pass_to_pass == ("t.py::also", "t.py::same")
    assert got.pass_to_fail == ("t.py::broken_by_it",)
    assert got.flaky == () and got.seen == 10 and got.pass_to_pass_total == 2
    assert rejection(got) is None


def test_flaky_tests_are_in_no_list():
    assert lists(BEFORE, AFTER, None, 0, flaky={"t.py::fixed", "t.py::same", "elsewhere"}) == TestLists(
        ("t.py::added", "t.py::new_test"), ("t.py::also",), ("t.py::broken_by_it",), ("t.py::fixed", "t.py::same"),
        10, 1)
    with pytest.raises(TypeError):
        lists(BEFORE, AFTER, None, 0)  # the flaky set is never forgotten


def test_pass_to_pass_is_a_seeded_sorted_sample_of_at_most_the_cap():
    before = {f"t.py::p{i:02d}": "passed" for i in range(40)} | {"t.py::f": "failed"}
    after = {k: "passed" for k in before}
    one, again, other = (lists(before, after, 5, seed, flaky=()) for seed in (1, 1, 2))
    assert one == again and one.pass_to_pass != other.pass_to_pass
    assert len(one.pass_to_pass) == 5 and list(one.pass_to_pass) == sorted(one.pass_to_pass)
    assert set(one.pass_to_pass) <= set(before) - {"t.py::f"} and one.pass_to_pass_total == 40
    assert lists(before, after, 0, 1, flaky=()).pass_to_pass == ()
    assert len(lists(before, after, 100, 1, flaky=()).pass_to_pass) == 40
    with pytest.raises(ValueError, match="cap"):
        lists(before, after, -1, 1, flaky=())


def test_flaky_finds_tests_whose_outcome_changes_between_runs():
    runs = [{"a": "passed", "b": "passed", "c": "failed", "d": "passed"},
            {"a": "passed", "b": "failed", "c": "failed"},
            {"a": "passed", "b": "passed", "c": "failed", "d": "passed", "e": "skipped"}]
    assert flaky(runs) == {"b", "d", "e"}  # missing from a run is an outcome
    assert flaky(runs[:1]) == set() and flaky([]) == set()


def test_rejections_name_their_reason():
    assert REJECTIONS == ("flaky_suite", "no_fail_to_pass")
    nothing_fixed = lists({"a": "passed", "b": "failed"}, {"a": "passed", "b": "failed"}, None, 0, flaky=())
    assert rejection(nothing_fixed) == "no_fail_to_pass"
    only_flaky_fix = lists({"a": "failed", "b": "passed"}, {"a": "passed", "b": "passed"}, None, 0, flaky={"a"})
    assert only_flaky_fix.fail_to_pass == () and rejection(only_flaky_fix, max_flaky_share=0.5) == "no_fail_to_pass"
    assert rejection(only_flaky_fix) == "flaky_suite"  # 1 of 2 tests is flaky: more than the default share


def test_reward_is_all_or_nothing_with_per_test_results():
    test_lists = TestLists(("t::f1", "t::f2"), ("t::p1",), (), (), 3, 1)
    assert reward(test_lists, {"t::f1": "passed", "t::f2": "passed", "t::p1": "passed", "t::other": "failed"}) == (
        1.0, {"t::f1": "passed", "t::f2": "passed", "t::p1": "passed"})
    assert reward(test_lists, {"t::f1": "passed", "t::f2": "passed", "t::p1": "failed"})[0] == 0.0
    score, results = reward(test_lists, {"t::f1": "passed", "t::p1": "passed"})
    assert score == 0.0 and results["t::f2"] == "missing"
    assert reward(test_lists, {"t::f1": "passed", "t::f2": "skipped", "t::p1": "passed"})[0] == 0.0
    assert reward(TestLists((), ("t::p1",), (), (), 1, 1), {"t::p1": "passed"}) == (0.0, {"t::p1": "passed"})
