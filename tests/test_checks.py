"""The order of judgement (`tasks/judge/checks.py`): every flag a judge module can raise is declared by the
check that emits it, so the table a reader sees is the truth. Fast: no Docker."""

from __future__ import annotations

import ast
from pathlib import Path

from trajforge.tasks.judge.checks import CHECKS

JUDGE = Path(__file__).resolve().parent.parent / "tasks" / "judge"
CONTRASTIVE = {"review_outlier"}  # added by the stage over an environment's successes, after CHECKS


def _values(node: ast.expr) -> set[str]:
    """The strings an expression can evaluate to (constants; both branches of `a if c else b`)."""
    if isinstance(node, ast.IfExp):
        return _values(node.body) | _values(node.orelse)
    return {node.value} if isinstance(node, ast.Constant) else set()


def _raised_kinds() -> set[str]:
    """Every string that can be a `HackFlag(kind=...)` in the judge package's source."""
    kinds = set()
    for path in JUDGE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "HackFlag":
                for kw in node.keywords:
                    if kw.arg == "kind":
                        kinds |= _values(kw.value)
    return kinds


def test_checks_are_named_once_and_declare_every_flag_they_raise():
    names = [c.name for c in CHECKS]
    assert len(names) == len(set(names))
    assert names[:5] == ["infrastructure", "trajectory", "toolchain", "final_state", "environment"]
    assert names.index("hidden_tests") < names.index("counterfactual") < names.index("sibling_replay") == len(names) - 1
    declared = {k for c in CHECKS for k in c.kinds}
    assert declared | CONTRASTIVE == _raised_kinds()


def test_the_counterfactual_reverts_only_what_can_change_the_tests_when_the_references_changes_are_unknown():
    """An environment neither validated nor profiled (`synthesize.validate_envs: false`; `tests_run_agent_code`
    still `unknown`) has no record of what its reference solution changes: reverting every change would flip
    every honest pass (its answer file reverted), so only the changes that can change how the tests run are
    reverted, as without a reference solution. Once the reference's changes are on record, every change it did
    not make is reverted."""
    from trajforge.schemas.common import ChangeSet
    from trajforge.schemas.environment import EnvSpec, FileSpec
    from trajforge.tasks.judge.changes import revert_plan

    work = "/home/agent/work"
    changes = ChangeSet(added=[f"{work}/report.json", f"{work}/conftest.py", f"{work}/notes.txt"], total=3)
    env = EnvSpec(env_id="e", family="f", level=1, seed=0, instruction="write report.json", image="img:1",
                  workdir=work, tests=[FileSpec(path="test_x.py", content="def test_a(): pass")])
    assert env.tests_run_agent_code == "unknown"
    assert revert_plan(changes, env) == [f"{work}/conftest.py"]
    env.tests_run_agent_code, env.expected_changes = "no", [f"{work}/report.json"]
    assert sorted(revert_plan(changes, env)) == [f"{work}/conftest.py", f"{work}/notes.txt"]
    env.expected_changes = []  # profiled, and the reference changed nothing: everything is the agent's own
    assert len(revert_plan(changes, env)) == 3
