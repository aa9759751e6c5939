"""The procedural tool families (tasks/envs/families, `ToolFamily`): registered next to the terminal ones,
deterministic, levels that turn real knobs, valid tool schemas, checks that see the intended change
AND everything else (collateral), distinct seeds kept by dedup while a planted copy is dropped; and in
real Docker, through the validator, level 1-3 of every family (one seed): image, no-op fails, the
oracle passes, deterministic, instance-specific (the solved store fails a sibling's checks)."""

from __future__ import annotations

import json
import runpy
import sqlite3
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from trajforge.schemas.config import SynthesizeConfig
from trajforge.tasks.envs.catalogue import sibling_of
from trajforge.tasks.envs.families import FAMILIES, get_family
from trajforge.tasks.envs.families.tool_base import ToolFamily
from trajforge.tasks.envs.tools import server as tool_server
from trajforge.tasks.envs.tools.spec import parse_call_command
from trajforge.tasks.envs.validator import dedup, shingles

TOOL_FAMILIES = sorted(n for n, f in FAMILIES.items() if f.kind == "tools" and f.__module__.startswith(
    "trajforge.tasks.envs.families."))
CASES = [(f, lvl) for f in TOOL_FAMILIES for lvl in (1, 2, 3)]


def _knobs(env):
    return json.loads(env.knobs_json)


def _materialize(env, folder: Path) -> Path:
    for f in env.files:
        (folder / f.path).parent.mkdir(parents=True, exist_ok=True)
        (folder / f.path).write_text(f.content)
    tool_server.init_store(str(folder / ".tools"), str(folder / "store.db"))
    return folder


def _call(folder: Path, name: str, arguments: dict) -> tuple[str, bool]:
    return tool_server.Tools(str(folder / ".tools"), str(folder / "store.db")).call(name, arguments)


def _module(env, folder: Path) -> dict:
    path = folder.parent / f"{folder.name}-{env.env_id}-checks.py"
    path.write_text(env.tests[0].content)
    return runpy.run_path(str(path), init_globals={"WORK": str(folder)})


def _checks(env, folder: Path) -> dict[str, str | None]:
    """{test name: None if it passed, else its message} for `env`'s checks on the store in `folder`."""
    ns = _module(env, folder)
    out: dict[str, str | None] = {}
    for name, fn in sorted(ns.items()):
        if name.startswith("test_") and callable(fn):
            try:
                fn()
                out[name] = None
            except AssertionError as err:
                out[name] = str(err) or "failed"
    return out


def _solve(env, folder: Path) -> list[str]:
    outputs = []
    for cmd in env.solution:
        name, arguments = parse_call_command(cmd)
        text, is_error = _call(folder, name, arguments)
        assert not is_error, (env.env_id, name, text)
        outputs.append(text)
    return outputs


def test_at_least_four_tool_families_with_three_levels():
    assert len(TOOL_FAMILIES) >= 4, TOOL_FAMILIES
    for name in TOOL_FAMILIES:
        fam = get_family(name)
        assert isinstance(fam, ToolFamily) and fam.levels == (1, 2, 3) and not fam.replay_invariant
        assert fam.generate(1, 0).kind == "tools"


@pytest.mark.parametrize("module", ["tasks.envs.tools.spec", "tasks.envs.families.tool_base", "tasks.envs.tools.checks",
                                    "tasks.envs.families.orders", "tasks.envs.families.base"])
def test_no_import_cycle_whatever_is_imported_first(module):
    """The registry imports the tool families, which import `families.base`: any entry point works."""
    import subprocess
    import sys

    code = f"import trajforge.{module}; from trajforge.tasks.envs.families import FAMILIES; print(len(FAMILIES))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-800:]


def test_same_seed_same_env_byte_for_byte():
    for name, level in CASES:
        fam = get_family(name)
        a, b, c = fam.generate(level, 3), fam.generate(level, 3), fam.generate(level, 4)
        assert a.model_dump_json() == b.model_dump_json(), (name, level)
        assert a.env_id != c.env_id and a.tests != c.tests, (name, level)
        assert all("test_" not in f.path for f in a.files), "hidden checks must not be in the image"


def test_tool_schemas_validate_and_the_oracle_respects_them():
    for name, level in CASES:
        env = get_family(name).generate(level, 0)
        tools = {t["name"]: t for t in json.loads(next(f.content for f in env.files if f.path == ".tools/tools.json"))}
        for t in tools.values():
            Draft202012Validator.check_schema(t["inputSchema"])
            assert t["inputSchema"]["type"] == "object" and len(t["description"]) > 10, t["name"]
        for cmd in env.solution:
            tool, arguments = parse_call_command(cmd)
            schema = tools[tool]["inputSchema"]
            assert not list(Draft202012Validator(schema).iter_errors(arguments)), (name, level, tool, arguments)
            assert tool_server.schema_errors(arguments, schema) == [], (name, level, tool)


def test_every_library_tool_stands_alone():
    """A tool may only use the shared helpers, never another tool (an instance offers a subset)."""
    import ast
    import builtins
    import importlib

    from trajforge.tasks.envs.families.tool_base import HELPERS

    for name in TOOL_FAMILIES:
        module = importlib.import_module(type(get_family(name)).__module__)
        helpers = HELPERS + module.DOMAIN_HELPERS
        defined = set(dir(builtins)) | {"ToolError"} | {
            n.id if isinstance(n, ast.Name) else n.name for n in ast.walk(ast.parse(helpers))
            if isinstance(n, (ast.FunctionDef, ast.alias)) or (isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store))}
        defined |= {a.asname or a.name for n in ast.walk(ast.parse(helpers)) if isinstance(n, ast.Import)
                    for a in n.names}
        for t in module.LIBRARY:
            fn = ast.parse(t.code).body[0]
            local = {a.arg for a in fn.args.args + fn.args.kwonlyargs} | {
                n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
            used = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
            assert not used - local - defined, (name, t.name, sorted(used - local - defined))


def test_levels_turn_real_knobs():
    """More tools and distractors, more oracle calls, and lookups that need a detail, level by level."""
    for name in TOOL_FAMILIES:
        for seed in (0, 1, 2):
            k1, k2, k3 = (_knobs(get_family(name).generate(lvl, seed)) for lvl in (1, 2, 3))
            assert k1["tools"] < k3["tools"] and k1["distractors"] < k2["distractors"] < k3["distractors"], name
            assert k1["oracle_calls"] < k2["oracle_calls"] < k3["oracle_calls"], (name, seed)
            assert k1["rows"] < k3["rows"] and k1["lookup"] != k3["lookup"] and k1["intent"] != k3["intent"], name


def test_instructions_state_goals_not_calls():
    for name, level in CASES:
        env = get_family(name).generate(level, 0)
        tools = [parse_call_command(c)[0] for c in env.solution]
        assert not [t for t in tools if t in env.instruction], (name, level, env.instruction)
        assert len(env.instruction) > 80
        if level > 1:  # the records are named the way a user names them: ids must be looked up
            ids = {v for c in env.solution for k, v in parse_call_command(c)[1].items()
                   if k.endswith("_id") and isinstance(v, int) and v >= 100}
            assert not [i for i in ids if str(i) in env.instruction], (name, level, ids)


def test_oracle_passes_noop_fails_and_collateral_is_checked(tmp_path):
    """On the host, through the real server code: the oracle passes every check, doing nothing fails
    the requested ones, the solved store fails a sibling's checks, and a stray change of one other row
    fails `test_nothing_else_changed`."""
    for name, level in CASES:
        env = get_family(name).generate(level, 0)
        folder = _materialize(env, tmp_path / f"{name}-{level}")
        noop = _checks(env, folder)
        assert noop["test_requested_changes"] and noop["test_nothing_else_changed"] is None, (name, level, noop)
        outputs = _solve(env, folder)
        solved = _checks(env, folder)
        assert not any(solved.values()), (name, level, solved)
        assert any(_checks(sibling_of(env), folder).values()), (name, level, "the sibling's checks pass too")
        if level == 3:  # the first lookup is ambiguous: two records match, the instruction's detail decides
            assert outputs[0].count('"id"') >= 2, (name, outputs[0][:300])
        expected = _module(env, folder)["EXPECTED"]
        table, spec = next((t, s) for t, s in sorted(expected["collateral"].items()) if s["rows"])
        con = sqlite3.connect(folder / "store.db")
        key = spec["cols"][0]
        con.execute(f"DELETE FROM {table} WHERE {key} = ?", (spec["rows"][-1][0],))
        con.commit()
        con.close()
        assert _checks(env, folder)["test_nothing_else_changed"], (name, level, table)


def test_tool_code_is_real_modules_and_their_text_is_what_ships(tmp_path, monkeypatch):
    """The tools, helpers and checks are functions of tasks/envs/families/tool_code (ruff reads them): the
    imported functions, called directly on a seeded store, solve each level and pass the imported checks,
    doing nothing fails them; and what the image and the tests hold is those functions' source text."""
    import importlib
    import random

    from trajforge.tasks.envs.families.tool_code import common
    from trajforge.tasks.envs.tools import checks
    from trajforge.tasks.envs.tools.code_text import source
    from trajforge.tasks.envs.tools.spec import seed_script

    requested = (common.test_requested_changes, common.test_requested_additions, common.test_nothing_else_changed)
    for name, level in CASES:
        family = get_family(name)
        code = importlib.import_module(f"trajforge.tasks.envs.families.tool_code.{name}")
        task = family.task(level, random.Random(f"{name}:{level}:0"))
        env = family.generate(level, 0)
        shipped = {f.path: f.content for f in env.files}[".tools/tools.py"]
        for t in task.tools:
            fn = getattr(code, t.name, None) or getattr(common, t.name)
            assert t.code == source(fn).strip() and t.code in shipped, (name, t.name)
        assert all(source(c) in env.tests[0].content for c in requested), name
        work = tmp_path / f"{name}-{level}"
        work.mkdir()
        db = sqlite3.connect(work / "store.db")
        db.executescript(seed_script(task))
        db.row_factory = sqlite3.Row
        monkeypatch.setattr(checks, "W", work)
        monkeypatch.setattr(common, "EXPECTED", task.expected)

        def failing(db: sqlite3.Connection = db) -> list[str]:
            db.commit()
            out = []
            for check in requested:
                try:
                    check()
                except AssertionError:
                    out.append(check.__name__)
            return out

        assert failing(), (name, level, "doing nothing passes")
        for call in task.oracle:
            (getattr(code, call.name, None) or getattr(common, call.name))(db, **call.arguments)
        assert failing() == [], (name, level)
        db.close()


def test_blanket_actions_fail(tmp_path):
    """"Cancel everything" passes the requested change but fails the collateral check."""
    env = get_family("bookings").generate(3, 0)
    folder = _materialize(env, tmp_path / "b3")
    con = sqlite3.connect(folder / "store.db")
    con.execute("UPDATE bookings SET status = 'cancelled'")
    con.commit()
    con.close()
    got = _checks(env, folder)
    assert got["test_requested_changes"] and got["test_nothing_else_changed"]
    env = get_family("orders").generate(1, 0)
    folder = _materialize(env, tmp_path / "o1")
    _solve(env, folder)
    con = sqlite3.connect(folder / "store.db")
    pending = [r[0] for r in con.execute("SELECT id FROM orders WHERE status = 'pending'")]
    con.close()
    assert pending
    for order in pending:  # through the tool, so stock moves exactly as the tool moves it
        assert not _call(folder, "cancel_order", {"order_id": order})[1]
    got = _checks(env, folder)
    assert "changed" in got["test_nothing_else_changed"], got


def test_tool_errors_are_helpful(tmp_path):
    env = get_family("bookings").generate(2, 0)
    folder = _materialize(env, tmp_path / "b2")
    text, is_error = _call(folder, "update_booking", {"booking_id": 17, "room": 101})
    assert is_error and text == "error: no booking 17", text
    text, is_error = _call(folder, "search_rooms", {"check_in": "2026-13-45", "nights": 2})
    assert is_error and "YYYY-MM-DD" in text, text
    with pytest.raises(tool_server.CallError, match="unknown tool"):
        _call(folder, "drop_everything", {})


def test_distinct_seeds_are_not_near_duplicates_but_a_planted_copy_is():
    threshold = SynthesizeConfig(families=[{"name": TOOL_FAMILIES[0]}]).dedup_threshold
    envs = [get_family(name).generate(level, seed) for name, level in CASES for seed in range(3)]
    assert dedup(envs, threshold) == {}
    for env in envs:  # trajforge's server is the same in every tool env: it is not the env's content
        assert not any("def schema_errors" in s for s in shingles(env))
    original = envs[0]
    words = original.instruction.split()
    words[len(words) // 2] = "kindly"
    copy = original.model_copy(update={"env_id": original.env_id + "-copy", "instruction": " ".join(words)})
    assert dedup([original, copy], threshold) == {copy.env_id: original.env_id}


@pytest.mark.docker
def test_validator_accepts_every_tool_family_and_level(docker_client):
    """Level 1-3 of every tool family, one seed, through the real validator in Docker."""
    from test_families import validate_generated

    results = validate_generated(docker_client, [(name, level, 0) for name, level in CASES])
    for case, v in zip(CASES, results):
        assert v.ok, (case, v.reject)
        assert all(v.checks.get(c) == "pass" for c in ("image", "tools_serve", "noop_fails", "no_leak",
                                                        "solution_passes", "deterministic", "instance_specific")), (
            case, v.checks)
        assert set(v.checks.values()) == {"pass"}, (case, v.checks)
