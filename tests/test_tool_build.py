"""A build mixing terminal and tool environments, end to end: real Prefect flow on a Dask LocalCluster,
real containers, the real MCP tool server in the sandbox, real Parquet read back with `datasets`.

One build (shared by every test here) holds:
- `log_report` (terminal), `bookings` and `orders` (tools), played by the replay teacher (the oracle);
- two planted-broken tool families (tests/planted_tools.py): tools.py that does not import
  (`tools_broken`) and a check that passes on the untouched store (`noop_passes`): the validator rejects
  both at synthesize;
- a second teacher replaying recorded trajectories (`replay.source`: a JSONL) that cheat: one claims
  success in text and submits without changing the store, two reach the requested state with a
  distractor / back-office tool that changes other records; all three must be verified failures. Its
  last recorded trajectory of `orders` is the oracle, so that environment is solved sometimes (`rl`).
"""

from __future__ import annotations

import json
import os
import posixpath
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from helpers import small_config

from trajforge.schemas.config import load_config, parse_config
from trajforge.tasks.engine.store import RunStore

E2E = [pytest.mark.docker, pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]


def e2e(fn):
    for mark in E2E:
        fn = mark(fn)
    return fn

ROOT = Path(__file__).resolve().parents[1]
TESTS = str(Path(__file__).resolve().parent)
TERMINAL = [("log_report", 1, 0)]
# (family, level, a distractor tool the cheats use): the first seed whose instance offers that tool is built
DISTRACTED = [("bookings", 1, "request_housekeeping"), ("orders", 2, "restock_product")]
HACKS = "hacks"


def _env(family: str, level: int, seed: int):
    from trajforge.tasks.envs.families import get_family

    return get_family(family).generate(level, seed)


def _offered(env) -> list[str]:
    return [t["name"] for t in json.loads(next(f.content for f in env.files if f.path == ".tools/tools.json"))]


def _tool_envs() -> list[tuple[str, int, int]]:
    return [(f, lvl, next(s for s in range(64) if tool in _offered(_env(f, lvl, s)))) for f, lvl, tool in DISTRACTED]


def _oracle(env) -> list[tuple[str, dict]]:
    from trajforge.tasks.envs.tools.spec import parse_call_command

    return [parse_call_command(c) for c in env.solution]


def _recorded(path: Path) -> dict[str, list[str]]:
    """The cheating trajectories (JSONL, as a user would bring them); returns env_id -> what each sample does."""
    from trajforge.tasks.envs.tools.spec import call_command

    booking, order = (_env(*t) for t in _tool_envs())
    b_oracle, o_oracle = _oracle(booking), _oracle(order)
    (_, b_args), = [c for c in b_oracle if c[0] == "cancel_booking"]
    claim = {"env_id": booking.env_id, "messages": [  # looks the booking up, says it is done, changes nothing
        {"role": "user", "content": booking.instruction},
        {"role": "assistant", "content": f"I have cancelled booking {b_args['booking_id']}; nothing else was changed.",
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "submit", "arguments": "{}"}}]}]}
    # the right cancellation plus a housekeeping request nobody asked for (a distractor tool: a new row)
    housekeeping = {"env_id": booking.env_id, "commands": [call_command(n, a) for n, a in b_oracle] + [
        call_command("request_housekeeping", {"room": 101, "note": "guest cancelled, free the room"})]}
    # the product swap reached by restocking (a back-office tool) before adding: stock changes nobody asked for
    swap = [call_command(n, a) for n, a in o_oracle]
    add = next(i for i, (n, _) in enumerate(o_oracle) if n == "add_item")
    restock = call_command("restock_product", {"sku": o_oracle[add][1]["sku"], "qty": 25})
    restocked = {"env_id": order.env_id, "commands": swap[:add] + [restock] + swap[add:]}
    honest = {"env_id": order.env_id, "commands": swap}
    path.write_text("".join(json.dumps(r) + "\n" for r in (claim, housekeeping, restocked, honest)))
    return {booking.env_id: ["claim", "housekeeping"], order.env_id: ["restock", "oracle"]}


@pytest.fixture(scope="module")
def tool_build(tmp_path_factory, prefect_api):
    import planted_tools

    from trajforge.flows.launch import run_build

    tmp = tmp_path_factory.mktemp("toolbuild")
    old_path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([TESTS, old_path or ""])  # the Dask workers import the plugin
    try:
        plan = _recorded(tmp / "hacks.jsonl")
        families = [{"name": f, "levels": [lvl], "seeds": [s]} for f, lvl, s in TERMINAL + _tool_envs()]
        families += [{"name": f.name, "levels": [1], "seeds": [0]} for f in planted_tools.PLANTED]
        cfg = parse_config(small_config(
            tmp / "runs", dataset="mixed", plugins=["planted_tools"], **{
                "synthesize.families": families, "rollout.samples_per_env": 1, "rollout.episodes_per_shard": 4,
                "rollout.max_turns": 10, "extra_teachers": [{"backend": "replay", "name": HACKS, "samples_per_env": 2,
                                                              "replay": {"source": str(tmp / "hacks.jsonl")}}]}))
        record = run_build(cfg)
        yield cfg, record, plan
    finally:
        planted_tools.unregister()
        if old_path is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old_path


def _rows(cfg, record, stage: str) -> list[dict]:
    store = RunStore(cfg.runs, cfg.dataset)
    manifest = store.read_json(posixpath.join(record["stages"][stage]["manifest"], "manifest.json"))
    return [r for p in manifest["parts"] for r in pq.read_table(p).to_pylist()]


def _rejects(record, stage: str) -> dict[str, str]:
    return {r["key"]: r["reason"] for r in pq.read_table(
        os.path.join(record["stages"][stage]["manifest"], "rejects.parquet")).to_pylist()}


def _tool_names(tools_json: str) -> list[str]:
    return sorted(t["function"]["name"] for t in json.loads(tools_json))


@e2e
def test_both_kinds_are_synthesized_and_the_planted_broken_are_rejected(tool_build):
    cfg, record, _ = tool_build
    assert record["status"] == "committed", record
    envs = {e["env_id"]: e for e in _rows(cfg, record, "synthesize")}
    kinds = {e["family"]: e["kind"] for e in envs.values()}
    assert kinds == {"log_report": "terminal", "bookings": "tools", "orders": "tools"}
    rejected = {k.split("-l")[0]: why for k, why in _rejects(record, "synthesize").items()}
    assert rejected == {"planted_tools_broken": "tools_broken", "planted_tools_noop": "noop_passes"}


@e2e
def test_tool_episodes_relay_the_oracle_through_the_server(tool_build):
    cfg, record, _ = tool_build
    envs = {e["env_id"]: e for e in _rows(cfg, record, "synthesize")}
    verdicts = {v["rollout_id"]: v for v in _rows(cfg, record, "verify")}
    replayed = [r for r in _rows(cfg, record, "rollout") if r["teacher"] == "replay"]
    assert len(replayed) == 3
    for r in replayed:
        env, v = envs[r["env_id"]], verdicts[r["rollout_id"]]
        assert r["status"] == "ok" and v["verified"] and v["passed"], (r["env_id"], r["error"], v["verifier_output"])
        if env["kind"] == "terminal":
            assert r["harness"] == "trajforge-bash-v1" and _tool_names(r["tools_json"]) == ["bash", "submit"]
            continue
        offered = json.loads(next(f["content"] for f in env["files"] if f["path"] == ".tools/tools.json"))
        assert r["harness"] == "trajforge-mcp-v1"
        assert _tool_names(r["tools_json"]) == sorted([t["name"] for t in offered] + ["submit"])
        calls = [c["function"] for m in r["messages"] if m["role"] == "assistant" for c in m["tool_calls"] or []]
        assert [(c["name"], json.loads(c["arguments"])) for c in calls[:-1]] == [tuple(c) for c in _oracle_of(env)]
        assert calls[-1]["name"] == "submit" and r["tool_call_errors"] == 0
        results = [m for m in r["messages"] if m["role"] == "tool"]
        assert results and not any(m["content"].startswith("error") for m in results)


def _oracle_of(env: dict) -> list[tuple[str, dict]]:
    from trajforge.tasks.envs.tools.spec import parse_call_command

    return [parse_call_command(c) for c in env["solution"]]


@e2e
def test_recorded_cheats_are_verified_failures(tool_build):
    cfg, record, plan = tool_build
    verdicts = {v["rollout_id"]: v for v in _rows(cfg, record, "verify")}
    seen = {}
    for r in _rows(cfg, record, "rollout"):
        if r["teacher"] != HACKS or r["env_id"] not in plan:
            continue
        what, v = plan[r["env_id"]][r["sample"]], verdicts[r["rollout_id"]]
        seen[what] = v["passed"]
        assert r["status"] == "ok" and v["verified"], (what, r["error"])
        failed = {t["name"] for t in v["tests"] if not t["passed"]}
        if what == "claim":  # the store is untouched: the requested change is missing
            assert failed == {"test_requested_changes"}, (what, v["verifier_output"])
        elif what == "housekeeping":  # the cancellation is there, plus a new row nobody asked for
            assert failed == {"test_nothing_else_changed"}, (what, v["verifier_output"])
        elif what == "restock":  # the swap is there, but the product's stock is not what the swap leaves
            assert "test_requested_changes" in failed, (what, v["verifier_output"])
    assert seen == {"claim": False, "housekeeping": False, "restock": False, "oracle": True}


@e2e
def test_calibration_labels_tool_environments_like_any_other(tool_build):
    cfg, record, _ = tool_build
    labels = {(c["family"], c["teacher"]): (c["label"], c["attempts"], c["passes"])
              for c in _rows(cfg, record, "calibrate")}
    for family in ("log_report", "bookings", "orders"):
        assert labels[(family, "replay")][1:] == (1, 1) and labels[(family, "replay")][0] != "unlabelled"
    assert labels[("bookings", HACKS)][1:] == (2, 0) and labels[("orders", HACKS)][1:] == (2, 1)
    assert labels[("log_report", HACKS)][1:] == (2, 0)  # nothing recorded for it: submits at once


@e2e
def test_export_has_rows_of_both_kinds_with_their_tools(tool_build):
    import datasets

    cfg, record, plan = tool_build
    folder = str(Path(cfg.runs) / cfg.dataset / "latest" / "dataset")
    envs = {e["env_id"]: e for e in _rows(cfg, record, "synthesize")}
    want_tools = {i: sorted([t["name"] for t in json.loads(next(
        f["content"] for f in e["files"] if f["path"] == ".tools/tools.json"))] + ["submit"])
        if e["kind"] == "tools" else ["bash", "submit"] for i, e in envs.items()}
    traj = datasets.load_dataset(folder, "trajectories")["train"]
    assert {r["harness"] for r in traj} == {"trajforge-bash-v1", "trajforge-mcp-v1"}
    for r in traj:
        assert _tool_names(r["tools_json"]) == want_tools[r["env_id"]], r["env_id"]
    sft = datasets.load_dataset(folder, "sft")["train"]
    assert {envs[r["env_id"]]["kind"] for r in sft} == {"terminal", "tools"} and all(r["passed"] for r in sft)
    tool_sft = next(r for r in sft if r["harness"] == "trajforge-mcp-v1")
    turn = next(m for m in tool_sft["messages"] if m["role"] == "assistant")
    assert turn["tool_calls"][0]["function"]["name"] in want_tools[tool_sft["env_id"]]
    assert tool_sft["train"] == [m["role"] == "assistant" for m in tool_sft["messages"]]
    pref = datasets.load_dataset(folder, "preference")["train"]  # the oracle (chosen) vs a cheat (rejected)
    tool_pairs = [p for p in pref if envs[p["env_id"]]["kind"] == "tools"]
    assert tool_pairs and all(_tool_names(p["tools_json"]) == want_tools[p["env_id"]] for p in tool_pairs)
    rl = datasets.load_dataset(folder, "rl")["train"]  # orders: the cheating teacher solves it once in two
    assert [(r["family"], r["teacher"]) for r in rl] == [("orders", HACKS)]
    assert json.loads(rl[0]["env_spec_json"])["kind"] == "tools"
    card = (Path(folder) / "README.md").read_text()
    assert "kinds (environments with exported rows): terminal 1, tools 2" in card


@e2e
def test_report_shows_the_environment_kinds(tool_build):
    cfg, record, _ = tool_build
    page = (Path(RunStore(cfg.runs, cfg.dataset).build_dir(record["build_id"])) / "report" / "index.html").read_text()
    table = page[page.index('id="kind-table"'):]
    table = table[:table.index("</table>")]
    assert "<td>terminal</td><td>1</td><td>3</td>" in table and "<td>tools</td><td>2</td><td>6</td>" in table


def test_shipped_tool_configs_parse():
    from trajforge.tasks.envs.families import get_family

    for name in ("tools.yaml", "tools-smollm2.yaml"):
        cfg = load_config(ROOT / "configs" / name)
        assert {get_family(f.name).kind for f in cfg.synthesize.families} >= {"tools"}
