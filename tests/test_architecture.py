"""The shape of the code: layer boundaries, fingerprints by meaning, contracts derived from records,
the pipeline graph as data. Fast: no Docker, no Prefect server."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIRS = ("__init__.py", "tasks", "schemas", "flows", "expectations", "configs")


def test_stage_code_imports_no_flow_prefect_or_dask():
    """Importing every module under tasks/ (in a fresh interpreter) loads neither trajforge.flows nor
    prefect nor distributed; and no file under tasks/ names them in an import statement."""
    for path in (ROOT / "tasks").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [("." * node.level) + (node.module or "")]
            for n in names:
                assert n.split(".")[0] not in ("prefect", "distributed", "prefect_dask"), f"{path}: imports {n}"
                assert "flows" not in n.lstrip(".").split("."), f"{path}: imports {n}"
    code = ("import importlib, pkgutil, sys, trajforge.tasks as t\n"
            "for m in pkgutil.walk_packages(t.__path__, 'trajforge.tasks.'): importlib.import_module(m.name)\n"
            "bad = sorted(n for n in sys.modules if n.split('.')[0] in ('prefect', 'distributed', 'prefect_dask')"
            " or n.startswith('trajforge.flows'))\n"
            "print(len([n for n in sys.modules if n.startswith('trajforge.tasks.')]), bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split(" ", 1)
    assert int(out[0]) > 30 and out[1].strip() == "[]", out


def test_tasks_top_level_holds_only_the_stages_and_the_graph():
    from trajforge.tasks.pipeline import STAGE_NAMES

    modules = {p.stem for p in (ROOT / "tasks").glob("*.py")} - {"__init__"}
    assert modules == set(STAGE_NAMES) | {"pipeline"}


def _copy_package(dest: Path) -> Path:
    pkg = dest / "trajforge"
    pkg.mkdir(parents=True)
    for name in PACKAGE_DIRS:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, pkg / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(src, pkg / name)
    return pkg


def _code_versions(root: Path) -> dict[str, str]:
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import trajforge.tasks.pipeline as p\n"
            "assert p.__file__.startswith(sys.argv[1]), p.__file__\n"
            "print(json.dumps({s.name: s.code_version() for s in p.STAGES}))")
    out = subprocess.run([sys.executable, "-c", code, str(root)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{path}: {old!r} not found"
    path.write_text(text.replace(old, new, 1))


def test_fingerprints_follow_meaning_not_text(tmp_path):
    """A comment, a docstring and an added reaper function reuse every stage; a changed expression in
    a stage's module (or a module it declares) invalidates exactly the stages that declare it."""
    pkg = _copy_package(tmp_path / "copy")
    before = _code_versions(pkg.parent)
    assert len(set(before.values())) == len(before), before

    _edit(pkg / "tasks" / "rollout.py", "class RolloutStage(Stage):", "# a comment\nclass RolloutStage(Stage):  # why")
    _edit(pkg / "tasks" / "verify.py", '"""Stage `verify`:', '"""Stage `verify` (reworded docstring):')
    _edit(pkg / "tasks" / "sandbox" / "verifier.py", "def run_hidden_tests(", "# comment only\ndef run_hidden_tests(")
    (pkg / "tasks" / "sandbox" / "reaper.py").write_text(
        (pkg / "tasks" / "sandbox" / "reaper.py").read_text() + "\n\ndef reap_everything_twice() -> int:\n    return 2\n")
    (pkg / "tasks" / "engine" / "progress.py").write_text(
        (pkg / "tasks" / "engine" / "progress.py").read_text() + "\nEVERY_S = 3.0\n")
    assert _code_versions(pkg.parent) == before

    _edit(pkg / "tasks" / "calibrate.py", "return [Shard(index=0)]", "return [Shard(index=0, payload={})]")
    after = _code_versions(pkg.parent)
    assert after["calibrate"] != before["calibrate"]
    assert {k: v for k, v in after.items() if k != "calibrate"} == {k: v for k, v in before.items() if k != "calibrate"}

    _edit(pkg / "tasks" / "sandbox" / "verifier.py", 'MARK = "__TF_RESULTS__ "', 'MARK = "__TF_RESULTS2__ "')
    changed = {k for k, v in _code_versions(pkg.parent).items() if v != after[k]}
    assert changed == {"synthesize", "rollout", "verify"}


def test_source_digest_ignores_comments_docstrings_and_layout():
    from trajforge.tasks.engine.codeversion import source_digest

    a = 'def f(x):\n    """Doc."""\n    return x + 1\n'
    b = '# header\ndef f(x):  # inline\n    """Other doc."""\n\n    return (x +\n            1)\n'
    assert source_digest(a) == source_digest(b)
    assert source_digest(a) != source_digest(a.replace("x + 1", "x + 2"))
    assert source_digest("def f():\n    'only a docstring'\n") == source_digest("def f():\n    pass\n")


def test_suites_take_value_sets_from_the_records():
    """Every `in_set` expectation on a Literal field of its stage's output is a reference, and it
    resolves to exactly the field's values: adding a status to the schema changes the gate with it."""
    from typing import get_args

    from trajforge.expectations.gate import load_suite
    from trajforge.schemas.calibration import Label
    from trajforge.schemas.common import INFRA_STATUSES, Status
    from trajforge.schemas.value_sets import RECORDS, literal_values

    for path in (ROOT / "expectations" / "suites").glob("*.json"):
        raw = json.loads(path.read_text())
        for e in raw.get("expectations", []):
            vs = e["kwargs"].get("value_set")
            if isinstance(vs, list) and not all(isinstance(v, bool) for v in vs) and len(vs) > 1:
                literal_fields = {f for m in RECORDS.values() for f, i in m.model_fields.items()
                                  if literal_values(i.annotation)}
                assert e["kwargs"]["column"] not in literal_fields, f"{path.name}: copy of a schema value set: {e}"
    in_set = lambda suite, col: next(e["kwargs"]["value_set"] for e in load_suite(suite)["expectations"]  # noqa: E731
                                     if e["kwargs"].get("column") == col and "value_set" in e["kwargs"])
    assert in_set("rollout", "status") == list(get_args(Status))
    assert in_set("calibrate", "label") == list(get_args(Label))
    assert set(in_set("export", "status")) == set(get_args(Status)) - INFRA_STATUSES


def test_a_bad_value_set_reference_names_itself():
    from trajforge.schemas.value_sets import resolve

    with pytest.raises(KeyError, match="Rollout.nope"):
        resolve({"$field": "Rollout.nope"})
    with pytest.raises(KeyError, match="not a Literal"):
        resolve({"$field": "Rollout.env_id"})
    with pytest.raises(KeyError, match="unknown name"):
        resolve({"$set": "NOPE"})


def _manifest(stage: str, name: str, stats: dict | None = None):
    from trajforge.tasks.engine import Manifest

    return Manifest(stage=stage, fingerprint=name, build_id="b", dir=f"/d/{name}", parts=[f"/d/{name}/p"], rows=1,
                    rejects=0, reject_reasons={}, stats=stats or {}, components={}, gate={}, created_at="")


def test_pipeline_graph_resolves_each_instance_its_inputs():
    """Round 0 and adaptive rounds read exactly what the stages expect, keyed as before."""
    from trajforge.tasks.pipeline import PIPELINE, resolve_inputs

    got = {n: _manifest(n.split(".")[0], n) for n in ("propose", "synthesize", "rollout", "verify", "calibrate",
                                                        "rollout.r1", "verify.r1", "calibrate.r1")}
    keys = lambda step, rnd, upto: {k: m.fingerprint for k, m in  # noqa: E731
                                    resolve_inputs(PIPELINE.step(step), {k: got[k] for k in upto}, rnd).items()}
    r0 = ["propose", "synthesize", "rollout", "verify", "calibrate"]
    assert keys("verify", 0, r0[:3]) == {"rollout": "rollout", "synthesize": "synthesize"}
    assert keys("calibrate", 0, r0[:4]) == {"verify": "verify", "synthesize": "synthesize"}
    assert keys("rollout", 1, r0) == {"synthesize": "synthesize", "calibrate": "calibrate"}
    assert keys("verify", 1, [*r0, "rollout.r1"]) == {"rollout": "rollout.r1", "synthesize": "synthesize"}
    assert keys("calibrate", 1, [*r0, "rollout.r1", "verify.r1"]) == {
        "verify": "verify", "verify.r1": "verify.r1", "synthesize": "synthesize"}
    assert keys("export", 0, list(got)) == {"rollout": "rollout", "rollout.r1": "rollout.r1", "verify": "verify",
                                            "verify.r1": "verify.r1", "calibrate": "calibrate.r1",
                                            "synthesize": "synthesize"}


def test_a_graph_that_starves_a_stage_is_refused():
    from trajforge.tasks.pipeline import Pipeline, Step
    from trajforge.tasks.verify import VerifyStage

    with pytest.raises(ValueError, match="requires"):
        Pipeline(steps=(Step(VerifyStage(), ("rollout@",)),))


def test_calibrate_hands_rollout_a_typed_plan_with_the_unsure_teachers(make_config):
    """The plan survives the engine's merge of shard stats (the teacher lists used to be dropped),
    and the rollout stage plans exactly from it."""
    from trajforge.schemas.calibration import RoundPlan
    from trajforge.tasks.calibrate import CalibrateStage
    from trajforge.tasks.engine import StageContext
    from trajforge.tasks.rollout import RolloutStage

    cfg = make_config(**{"teacher": {"backend": "replay", "name": "model"},
                         "extra_teachers": [{"backend": "replay", "name": "reference", "samples_per_env": 1}]})
    ctx = StageContext.create(cfg, "b")
    plan = RoundPlan(needs_more={"e1": 1}, next_sample={"e1": 2}, unsure_teachers={"e1": ["model", "reference"]})
    merged = CalibrateStage().summarize(ctx, [{"environments": 1, "round_plan": plan.model_dump()}])
    assert RoundPlan.of(merged) == plan
    shards = RolloutStage().plan(ctx, {"calibrate": _manifest("calibrate", "c", merged)})
    assert sorted(tuple(w) for s in shards for w in s.payload["episodes"]) == [("e1", 2, 0), ("e1", 2, 1)]


def test_readme_layout_matches_the_tree():
    """Every path the README's layout table names exists, and every package under tasks/ is named."""
    import re

    text = (ROOT / "README.md").read_text()
    layout = text[text.index("## Layout"):]
    layout = layout[:layout.find("\n## ", 3)] if "\n## " in layout[3:] else layout
    named = re.findall(r"^\| `([^`]+)`", layout, re.M) + re.findall(r"^\| `[^`]+`, `([^`]+)`", layout, re.M)
    assert named, "no layout table"
    for path in named:
        assert (ROOT / path.rstrip("/")).exists(), f"README names {path}, which does not exist"
    packages = {f"tasks/{p.parent.name}/" for p in (ROOT / "tasks").glob("*/__init__.py")}
    assert packages <= set(named), f"not in the README's layout: {sorted(packages - set(named))}"
