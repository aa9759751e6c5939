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


def _package_imports(folder: str) -> dict[str, set[str]]:
    """Per module under `folder` (relative to the repository): the package modules it imports, anywhere in it."""
    from trajforge.tasks.engine.codeversion import imported_modules

    out = {}
    for path in (ROOT / folder).rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(("trajforge", *(parts[:-1] if parts[-1] == "__init__" else parts)))
        out[name] = imported_modules(name, path.read_text())
    return out


def test_judging_imports_point_down_to_the_sandbox():
    """judge ← sandbox: nothing in tasks/sandbox imports tasks/judge, and judging reads only records and
    the sandbox (never a stage, the agent, environments or teachers)."""
    for name, imports in _package_imports("tasks/sandbox").items():
        assert not [m for m in imports if m.startswith("trajforge.tasks.judge")], (name, imports)
    allowed = ("trajforge.schemas", "trajforge.tasks.sandbox", "trajforge.tasks.judge")
    for name, imports in _package_imports("tasks/judge").items():
        bad = [m for m in imports - {"trajforge", "trajforge.tasks"} if not m.startswith(allowed)]
        assert not bad, (name, bad)


# -- the layering -------------------------------------------------------------------------------
# records <- contracts <- engine <- machinery <- stages <- orchestration: a module imports its own layer
# or one below, at module level or inside a function (docs/architecture.md, "Layers").
LAYERS = ("records", "contracts", "engine", "machinery", "stages", "orchestration")
MACHINERY = ("redaction", "difficulty", "sandbox", "judge", "teachers", "envs", "agent", "dataset")
"""The packages of the machinery layer, lowest first: each imports only packages before it (and itself)."""
UPWARD = {("teachers", "envs"): "replay and recorded trajectories render an environment's reference solution in "
                                "its kind's terms (tool calls): the environment kinds' registry (issue 29, item 2)"}
"""Machinery imports that still point up, each with its reason. It may only shrink: an entry no module
needs any more fails the test until it is removed."""
THIRD_PARTY = {"docker": ("tasks.sandbox", "tasks.envs", "flows"),  # containers; image builds; doctor, CLI
               "prefect": ("flows",), "prefect_dask": ("flows",), "distributed": ("flows",)}
"""Libraries only some parts may import (by package, relative to trajforge)."""


def _layer(module: str) -> str | None:
    """The layer of a package module; None for the parent packages (`trajforge`, `trajforge.tasks`)."""
    parts = module.split(".")[1:]
    if not parts or parts == ["tasks"]:
        return None
    top = {"schemas": "records", "expectations": "contracts", "flows": "orchestration"}.get(parts[0])
    if top or parts[0] != "tasks":
        return top
    if parts[1] == "engine":
        return "engine"
    return "machinery" if (ROOT / "tasks" / parts[1]).is_dir() else "stages"


def _upward(name: str, imports: set[str]) -> list[str]:
    """The imports of module `name` that break the layering (machinery: by package, `UPWARD` aside)."""
    bad, own = [], _layer(name)
    for m in sorted(imports):
        theirs = _layer(m)
        if own is None or theirs is None:
            continue
        if LAYERS.index(theirs) > LAYERS.index(own):
            bad.append(m)
        elif own == theirs == "machinery":
            a, b = name.split(".")[2], m.split(".")[2]
            assert a in MACHINERY and b in MACHINERY, f"a machinery package missing from MACHINERY: {a} or {b}"
            if MACHINERY.index(b) > MACHINERY.index(a) and (a, b) not in UPWARD:
                bad.append(m)
        elif own == theirs == "stages" and name != "trajforge.tasks.pipeline":
            bad.append(m)  # a stage imports no other stage: only the graph (`pipeline`) names them all
    return bad


def _every_module_imports() -> dict[str, set[str]]:
    out = {}
    for folder in ("schemas", "expectations", "tasks", "flows"):
        out.update(_package_imports(folder))
    return out


def test_every_import_points_down():
    """records <- contracts <- engine <- machinery <- stages <- orchestration, function-level imports
    included; inside the machinery, packages in `MACHINERY` order (judging and Docker apart: below)."""
    imports = _every_module_imports()
    bad = {name: b for name, found in imports.items() if (b := _upward(name, found))}
    assert not bad, f"imports that point up: {bad}"
    used = {(name.split(".")[2], m.split(".")[2]) for name, found in imports.items() if _layer(name) == "machinery"
            for m in found if _layer(m) == "machinery"}
    assert set(UPWARD) <= used, f"UPWARD lists exceptions no module needs any more: {set(UPWARD) - used}"


def test_the_architecture_page_draws_this_layering():
    """docs/architecture.md's picture names the layers' folders in this order and the machinery
    packages in `MACHINERY` order (highest first), and lists the `UPWARD` exceptions."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    picture = text[text.index("## Layers"):].split("```")[1]
    rows = [line.split()[0] for line in picture.strip().splitlines() if line.strip() and not line.startswith(" ")]
    assert rows == ["flows/", "tasks/*.py", "machinery", "tasks/engine/", "expectations/", "schemas/"], rows
    assert " ▸ ".join(reversed(MACHINERY)) in picture, "the machinery order in the picture differs from MACHINERY"
    for low, high in UPWARD:
        assert f"`{low}` → `{high}`" in text, f"the page does not list the upward import {low} -> {high}"


def test_the_layering_rule_sees_lazy_and_relative_imports():
    """The rule is not blind: an import inside a function, a relative one and a machinery package
    importing one above it are each caught (the import forms records took before this rule)."""
    from trajforge.tasks.engine.codeversion import imported_modules

    lazy = "def f():\n    from ..tasks.teachers import BACKENDS\n"
    assert _upward("trajforge.schemas.config", imported_modules("trajforge.schemas.config", lazy))
    up = "from ..sandbox.reaper import owner_alive\n"
    assert _upward("trajforge.tasks.engine.lease", imported_modules("trajforge.tasks.engine.lease", up))
    assert _upward("trajforge.tasks.dataset.card", {"trajforge.tasks.calibrate"})
    assert _upward("trajforge.tasks.sandbox.reaper", {"trajforge.tasks.judge.verifier"})
    assert _upward("trajforge.tasks.export", {"trajforge.tasks.calibrate"})
    assert _upward("trajforge.flows.deployments", {"trajforge.flows.cli"}) == []  # the flows rule is separate
    assert not _upward("trajforge.tasks.pipeline", {"trajforge.tasks.export", "trajforge.tasks.engine"})


def test_nothing_imports_the_command_line():
    """The CLI (`flows/cli.py`, with `envs_cli.py`) is the top: no module imports it (library entry
    points such as `run_build` live in `flows/launch.py`)."""
    for name, found in _every_module_imports().items():
        if name == "trajforge.flows.cli":
            continue
        assert "trajforge.flows.cli" not in found, name
        assert "trajforge.flows.envs_cli" not in found, name


def test_libraries_stay_where_they_belong():
    """Docker's SDK only in the sandbox, image builds and flows; Prefect and Dask only in flows."""
    for path in [*(ROOT / "tasks").rglob("*.py"), *(ROOT / "schemas").rglob("*.py"),
                 *(ROOT / "expectations").rglob("*.py"), *(ROOT / "flows").rglob("*.py")]:
        where = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and not node.level and node.module else [])
            for n in names:
                allowed = THIRD_PARTY.get(n.split(".")[0])
                assert allowed is None or any(where == a or where.startswith(a + ".") for a in allowed), \
                    f"{path.relative_to(ROOT)}: imports {n}"


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


def _code_versions(*roots: Path) -> list[dict[str, tuple[str, list[str]]]]:
    """Per package copy (`root/trajforge`), per stage: its code version and the modules it covers (one
    interpreter per copy, all at once)."""
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import trajforge.tasks.pipeline as p\n"
            "assert p.__file__.startswith(sys.argv[1]), p.__file__\n"
            "print(json.dumps({s.name: (s.code_version(), s.code_module_names()) for s in p.STAGES}))")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(root)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for root in roots]
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate()
        assert proc.returncode == 0, stderr[-2000:]
        out.append({k: (v, m) for k, (v, m) in json.loads(stdout).items()})
    return out


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{path}: {old!r} not found"
    path.write_text(text.replace(old, new, 1))


def _changed_expression(source: str) -> str:
    """`source` with one expression changed: its first constant that is not a docstring (a number
    plus one, a string with a letter added), else an added statement."""
    tree = ast.parse(source)
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
                  and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and id(node) not in docstrings and type(node.value) in (int, float, str):
            node.value = node.value + "x" if isinstance(node.value, str) else node.value + 1
            return ast.unparse(tree)
    return source + "\n_CHANGED = 1\n"


def _change_expression(path: Path) -> None:
    path.write_text(_changed_expression(path.read_text()))


def _changed(before: dict, after: dict) -> set[str]:
    return {k for k in before if before[k][0] != after[k][0]}


def _reaching(versions: dict, module: str) -> set[str]:
    return {k for k, (_, modules) in versions.items() if f"trajforge.{module}" in modules}


def test_fingerprints_follow_meaning_not_text(tmp_path):
    """On copies of the package: a comment, a docstring and any edit of an operational module reuse
    every stage; a changed expression in a module invalidates exactly the stages whose import
    closure reaches it (the sandbox's change walk and checksum script: at least synthesize, rollout
    and verify, which run sandboxes; a stage module only itself)."""
    base = _copy_package(tmp_path / "base")
    copies = {name: shutil.copytree(base.parent, tmp_path / name.replace("/", "_")) / "trajforge"
              for name in ("text", "tasks/sandbox/walk.py", "tasks/sandbox/checksums.py", "tasks/calibrate.py",
                           "tasks/difficulty/bands.py")}
    pkg = copies["text"]
    _edit(pkg / "tasks" / "rollout.py", "class RolloutStage(Stage):", "# a comment\nclass RolloutStage(Stage):  # why")
    _edit(pkg / "tasks" / "verify.py", '"""Stage `verify`:', '"""Stage `verify` (reworded docstring):')
    _edit(pkg / "tasks" / "judge" / "verifier.py", "def run_hidden_tests(", "# comment only\ndef run_hidden_tests(")
    (pkg / "tasks" / "sandbox" / "reaper.py").write_text(
        (pkg / "tasks" / "sandbox" / "reaper.py").read_text() + "\n\ndef reap_everything_twice() -> int:\n    return 2\n")
    for operational in ("tasks/engine/progress.py", "tasks/engine/lease.py", "tasks/teachers/vllm_server.py",
                        "tasks/teachers/cpu_profile.py", "tasks/teachers/endpoints.py", "expectations/gate.py"):
        _change_expression(pkg / operational)
    for module in list(copies)[1:]:
        _change_expression(copies[module] / module)

    before, *after = _code_versions(base.parent, *(p.parent for p in copies.values()))
    assert len({v for v, _ in before.values()}) == len(before), before
    after = dict(zip(copies, after))
    assert after.pop("text") == before
    for module, must in (("tasks/sandbox/walk.py", {"synthesize", "rollout", "verify"}),
                         ("tasks/sandbox/checksums.py", {"synthesize", "rollout", "verify"}),
                         ("tasks/calibrate.py", {"calibrate"}),  # a stage: no other stage imports it
                         ("tasks/difficulty/bands.py", {"calibrate", "export"})):  # the card's label definitions
        reaching = _reaching(before, module.removesuffix(".py").replace("/", "."))
        assert must <= reaching, (module, reaching)
        assert _changed(before, after[module]) == reaching, module


def test_every_module_of_a_stage_closure_counts():
    """For every stage, a changed expression in any module of its closure changes its code version;
    the closure holds no operational module."""
    from trajforge.tasks.engine.codeversion import (
        is_operational,
        module_digest,
        module_source,
        modules_digest,
        source_digest,
    )
    from trajforge.tasks.pipeline import STAGES

    changed = {}
    for stage in STAGES:
        names, version = stage.code_module_names(), stage.code_version()
        assert type(stage).__module__ in names and not [n for n in names if is_operational(n)]
        for name in names:
            if name not in changed:
                changed[name] = source_digest(_changed_expression(module_source(name)))
                assert changed[name] != module_digest(name), name
            digest = lambda n, name=name: changed[n] if n == name else module_digest(n)  # noqa: E731
            assert modules_digest(names, digest) != version, (stage.name, name)


def test_the_closure_sees_every_module_python_loads():
    """Importing a stage's module loads only modules of its static closure (taken without the
    operational exclusions: the modules loaded through an operational one are left out of it)."""
    from trajforge.tasks.engine.codeversion import closure
    from trajforge.tasks.pipeline import STAGES

    code = ("import importlib, json, sys\nout = {}\n"
            "for name in sys.argv[1:]:\n"
            "    for n in [n for n in sys.modules if n.split('.')[0] == 'trajforge']: del sys.modules[n]\n"
            "    importlib.import_module(name)\n"
            "    out[name] = sorted(n for n in sys.modules if n.split('.')[0] == 'trajforge')\n"
            "print(json.dumps(out))")
    modules = [type(s).__module__ for s in STAGES]
    out = subprocess.run([sys.executable, "-c", code, *modules], capture_output=True, text=True, check=True)
    for name, loaded in json.loads(out.stdout).items():
        assert len(loaded) > 30
        assert set(loaded) <= set(closure([name], operational=())), (name, set(loaded) - set(closure([name], ())))


def test_import_closure_reads_every_import_form():
    """Absolute and relative imports, `from . import submodule`, imports inside functions, the parent
    packages an import runs, and a sibling source named as a file; other packages are left out."""
    from trajforge.tasks.engine.codeversion import imported_modules

    source = ("import json\nimport trajforge.tasks.sandbox.walk\nfrom .. import families\n"
              "from .spec import ToolTask\nfrom . import client as c\n"
              "def f():\n    from ...engine.store import RunStore\n    from trajforge.schemas import common\n"
              "SERVER = 'server.py'\n")
    t = "trajforge.tasks"
    expected = {"trajforge", t, f"{t}.sandbox", f"{t}.sandbox.walk", f"{t}.envs", f"{t}.envs.families",
                f"{t}.envs.tools.spec", f"{t}.envs.tools.client", f"{t}.engine", f"{t}.engine.store",
                "trajforge.schemas", "trajforge.schemas.common", f"{t}.envs.tools.server"}
    assert imported_modules(f"{t}.envs.tools", source) == expected  # in a package's `__init__`
    # the same lines in a module of that package (a module never counts as importing itself)
    assert imported_modules(f"{t}.envs.tools.spec", source) == expected - {f"{t}.envs.tools.spec"} | {f"{t}.envs.tools"}


def test_a_family_registered_by_its_package_counts():
    """A family lives in the registry because `envs/families/__init__.py` imports it: every stage that
    imports the registry covers it, tool families included."""
    from trajforge.tasks.pipeline import STAGES

    for stage in STAGES:
        names = stage.code_module_names()
        assert {"trajforge.tasks.envs.families.sql_query", "trajforge.tasks.envs.families.orders"} <= set(names)


def test_every_module_is_fingerprinted_or_named():
    """Each module of the package (outside flows/) is in some stage's closure, operational, or one of
    the few that no stage runs: a source read as data and reached by no rule would show up here."""
    import pkgutil

    import trajforge
    from trajforge.tasks.engine.codeversion import OPERATIONAL, is_operational, module_file
    from trajforge.tasks.pipeline import STAGES

    assert all(module_file(f"trajforge.{op}") for op in OPERATIONAL), "an operational module that does not exist"
    outside_builds = {"trajforge.tasks.pipeline",  # the graph: which stages run on what (upstream fingerprints)
                      "trajforge.tasks.envs.corpus",  # `trajforge envs import`, outside a build
                      "trajforge.tasks.dataset.atif",  # `trajforge export --format atif`, after a build
                      "trajforge.tasks.dataset.chat",  # a trainer's chat-template render of exported rows
                      "trajforge.tasks.dataset.env_tree",  # `trajforge publish --environments`, after a build
                      "trajforge.schemas.value_sets"}  # value sets of the gate's suites
    covered = set().union(*(s.code_module_names() for s in STAGES))
    modules = {m.name for m in pkgutil.walk_packages(trajforge.__path__, "trajforge.")
               if not m.name.startswith("trajforge.flows")}
    assert {m for m in modules - covered if not is_operational(m)} == outside_builds


def test_code_facts_cached_by_text_give_what_a_parse_gives(tmp_path, monkeypatch):
    """A module's digest and imports come from `$TRAJFORGE_CACHE/codeversion` only for the same bytes: a cold
    process and a warm one compute the same closure; an entry that does not parse as facts is computed again."""
    from trajforge.tasks.engine import codeversion as cv

    monkeypatch.setenv("TRAJFORGE_CACHE", str(tmp_path))
    name = "trajforge.tasks.verify"

    def fresh() -> tuple[frozenset[str], str]:
        cv._file_facts.cache_clear()
        return cv._file_facts(name)

    tree = cv.parse_python(cv.module_file(name).read_text())
    parsed = (frozenset(cv._imports_in(name, tree)), cv._tree_digest(tree))
    cold = fresh()
    entries = list((tmp_path / "codeversion").glob("*.json"))
    assert cold == parsed and len(entries) == 1
    assert fresh() == parsed  # from the entry
    entries[0].write_text('{"digest": 1')
    assert fresh() == parsed
    assert json.loads(entries[0].read_text())["digest"] == parsed[1]  # written again, whole
    cv._file_facts.cache_clear()


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


def test_downstream_follows_inputs_forward_never_an_adaptive_rounds_back_edge():
    """What an early service is begun for (flows/build.py `_launch_early`): the later stages that read a stage's rows.
    Rollout reads calibrate only in an adaptive round, which is decided later: calibrate running starts no teacher."""
    from trajforge.tasks.pipeline import PIPELINE

    assert PIPELINE.downstream("propose") == ["synthesize", "rollout", "verify", "calibrate", "export"]
    assert PIPELINE.downstream("synthesize") == ["rollout", "verify", "calibrate", "export"]
    assert PIPELINE.downstream("verify") == ["calibrate", "export"]
    assert PIPELINE.downstream("calibrate") == ["export"]
    assert PIPELINE.downstream("export") == []


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


def test_layout_page_matches_the_tree():
    """Every path the layout table (docs/layout.md) names exists, and every package under tasks/ is named."""
    import re

    layout = (ROOT / "docs" / "layout.md").read_text()
    named = re.findall(r"^\| `([^`]+)`", layout, re.M) + re.findall(r"^\| `[^`]+`, `([^`]+)`", layout, re.M)
    assert named, "no layout table"
    for path in named:
        assert (ROOT / path.rstrip("/")).exists(), f"docs/layout.md names {path}, which does not exist"
    packages = {f"tasks/{p.parent.name}/" for p in (ROOT / "tasks").glob("*/__init__.py")}
    assert packages <= set(named), f"not in docs/layout.md: {sorted(packages - set(named))}"
