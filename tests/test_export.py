"""The export stage's column-wise join, on committed-looking upstream parts (no Docker needed):
messages pass through untouched, verdict/quality/calibration columns land on the right rows, and
every dropped rollout is a reject with its reason."""

from __future__ import annotations

import json
import posixpath
from pathlib import Path

import pytest

from trajforge.schemas.calibration import Calibration
from trajforge.schemas.common import Reject
from trajforge.schemas.config import load_config
from trajforge.schemas.environment import EnvSpec, FileSpec
from trajforge.schemas.export import TrajectoryRow
from trajforge.schemas.trajectory import FunctionCall, Message, Rollout, ToolCall
from trajforge.schemas.verdict import Quality, TestResult, Verdict
from trajforge.tasks.engine import Manifest, Shard, StageContext, execute_shard
from trajforge.tasks.export import ExportStage

ROOT = Path(__file__).resolve().parent.parent


def _messages(i: int) -> list[Message]:
    call = ToolCall(id="c1", function=FunctionCall(name="bash", arguments=f'{{"command": "cat f{i}"}}'))
    return [Message(role="system", content="s"), Message(role="user", content=f"task {i}"),
            Message(role="assistant", tool_calls=[call]),
            Message(role="tool", tool_call_id="c1", name="bash", content=f"[exit code 0]\n{i}")]


def _verdict(i: int, env: str, **kw) -> Verdict:
    base = dict(rollout_id=f"r{i}", env_id=env, teacher="t", sample=i, status="ok", verified=True,
                passed=False, reward=0.5, tests=[TestResult(name="a", passed=True), TestResult(name="b", passed=False)],
                quality=Quality(labels=["inspect", "act"], inspect_before_act=True, act_verify_share=0.5,
                                repeated_commands=i))
    return Verdict(**{**base, **kw})


def _manifests(store, parts: dict) -> dict[str, Manifest]:
    out = {}
    for name, (model, rows) in parts.items():
        path = posixpath.join(store.root, "up", name, "part-00000.parquet")
        store.write_records(path, model, rows)
        out[name] = Manifest(stage=name, fingerprint="x", build_id="b", dir=posixpath.dirname(path), parts=[path],
                             rows=len(rows), rejects=0, reject_reasons={}, stats={}, components={}, gate={},
                             created_at="")
    return out


@pytest.fixture
def setup(tmp_path):
    calls = iter(range(100))

    def make(messages=None, tools_json: str = "[]", **filters):
        cfg = load_config(ROOT / "configs/replay.yaml",
                          {"runs": str(tmp_path / f"call{next(calls)}"), "dataset": "exp", **{f"export.filters.{k}": v for k, v in filters.items()}})
        ctx = StageContext.create(cfg, "b")
        envs = [EnvSpec(env_id=e, family=f"fam-{e}", level=k + 1, seed=k, instruction="x",
                        tests=[FileSpec(path="test_x.py", content="def test_a(): pass")], solution=["true"],
                        build_egress="allowlist" if e == "e0" else None)
                for k, e in enumerate(["e0", "e1"])]
        rollouts = [Rollout(rollout_id=f"r{i}", env_id=f"e{i % 2}", teacher="t", harness="h", sample=i,
                            messages=(messages or _messages)(i), tools_json=tools_json,
                            status="ok" if i != 4 else "infra_error", turns=2,
                            prompt_tokens=10 + i, completion_tokens=5, wall_s=1.0) for i in range(6)]
        verdicts = [_verdict(0, "e0", passed=True, reward=1.0,
                             tests=[TestResult(name="a", passed=True), TestResult(name="b", passed=True)]),
                    _verdict(1, "e1"),
                    _verdict(2, "e0", hack_flags=["forge_reward"]),
                    _verdict(3, "e1", quality=Quality(labels=["act"], act_verify_share=0.0, repeated_commands=3)),
                    _verdict(4, "e0", status="infra_error", verified=False, reward=0.0, tests=[])]
        # r5 has no verdict at all
        calib = [Calibration(env_id=e, family=f"fam-{e}", level=1, teacher="t", attempts=3, passes=1, excluded=1,
                             solve_rate=0.33, ci_low=0.1, ci_high=0.8, label=lab, certain=False)
                 for e, lab in [("e0", "medium"), ("e1", "hard")]]
        up = _manifests(ctx.store, {"synthesize": (EnvSpec, envs), "rollout": (Rollout, rollouts),
                                    "verify": (Verdict, verdicts), "calibrate": (Calibration, calib)})
        plan = posixpath.join(ctx.store.root, "export-plan")
        info = execute_shard(ExportStage(), ctx, plan, Shard(index=0, payload={"part": up["rollout"].parts[0]}), up)
        info["path"] = posixpath.join(plan, info["part"])
        rows = {r.rollout_id: r for r in ctx.store.read_records([posixpath.join(plan, info["part"])], TrajectoryRow)}
        rejects = {r.key: r.reason for r in ctx.store.read_records(
            [posixpath.join(plan, "_rejects", "part-00000.parquet")], Reject)}
        return info, rows, rejects, {r.rollout_id: r for r in rollouts}
    return make


def test_join_puts_each_column_on_its_row(setup):
    info, rows, rejects, rollouts = setup()
    assert rejects == {"r4": "unverified", "r5": "no_verdict"}
    assert sorted(rows) == ["r0", "r1", "r2", "r3"] and info["rows"] == 4 and info["stats"]["passed"] == 1
    r0, r1, r3 = rows["r0"], rows["r1"], rows["r3"]
    dumped = lambda msgs: [m.model_dump() for m in msgs]  # noqa: E731 (exported: ExportMessage, same fields)
    assert dumped(r0.messages) == dumped(rollouts["r0"].messages) and dumped(r3.messages) == dumped(rollouts["r3"].messages)
    assert (r0.family, r0.level, r0.difficulty, r0.passed, r0.tests_passed, r0.tests_total) == \
        ("fam-e0", 1, "medium", True, 2, 2)
    assert (r1.family, r1.level, r1.difficulty, r1.passed, r1.tests_passed, r1.prompt_tokens) == \
        ("fam-e1", 2, "hard", False, 1, 11)
    assert rows["r2"].hack_flags == ["forge_reward"]
    assert (r0.build_egress, r1.build_egress) == ("allowlist", "unknown")  # the policy that built the image
    assert (r3.step_labels, r3.act_verify_share, r3.repeated_commands) == (["act"], 0.0, 3)


def test_filters_drop_with_their_reason(setup):
    _, rows, rejects, _ = setup(drop_hacks=True, min_act_verify_share=0.4)
    assert sorted(rows) == ["r0", "r1"]
    assert rejects == {"r2": "filter_hack", "r3": "filter_low_act_verify_share", "r4": "unverified",
                       "r5": "no_verdict"}
    _, rows, rejects, _ = setup(max_repeated_commands=1)
    assert sorted(rows) == ["r0", "r1"] and rejects["r2"] == rejects["r3"] == "filter_repeated_commands"


def test_preference_pairs_only_share_a_prompt():
    from trajforge.schemas.arrow import to_table
    from trajforge.tasks.export import preference

    def row(rid: str, system: str, passed: bool, tools: str = "[]") -> TrajectoryRow:
        msgs = [Message(role="system", content=system), Message(role="user", content="task"),
                Message(role="assistant", content=f"```bash\necho {rid}\n```")]
        return TrajectoryRow(rollout_id=rid, env_id="e", family="f", level=1, teacher="t", harness="h", sample=0,
                             messages=msgs, tools_json=tools, status="ok", passed=passed, reward=float(passed),
                             tests_passed=int(passed), tests_total=1, hack_flags=[], step_labels=[],
                             inspect_before_act=False, act_verify_share=0.0, ends_with_verify=False,
                             repeated_commands=0, failed_commands=0, recoveries=0, turns=1, prompt_tokens=1,
                             completion_tokens=1, wall_s=0.1, difficulty="medium", solve_rate=0.5)

    table = to_table(TrajectoryRow, [row("w1", "fenced", True), row("l1", "tools", False),
                                     row("l2", "fenced", False, tools='[{"x": 1}]'), row("l3", "fenced", False)])
    pairs = preference(None, table, {}).to_pylist()
    assert [(p["chosen_id"], p["rejected_id"]) for p in pairs] == [("w1", "l3")]
    assert [m["role"] for m in pairs[0]["prompt"]] == ["system", "user"] and pairs[0]["prompt"][0]["content"] == "fenced"


BASH = {"type": "function", "function": {"name": "bash", "description": "Run a command.", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}


def test_trainers_get_tools_and_arguments_as_objects_and_malformed_calls_are_flagged(setup):
    """Issue 31 item 1: `tools` is a list of JSON-schema function definitions and every call's arguments a
    JSON object, both typed JSON (dicts once loaded with `datasets`, what `apply_chat_template(messages,
    tools=...)` and TRL take). Arguments that are not a JSON object are kept as the text the model wrote
    (a JSON string) and counted in `malformed_tool_calls`, never repaired."""
    import datasets

    written = {1: "cat f1", 3: '["cat", "f3"]'}  # not JSON; JSON but not an object

    def messages(i: int) -> list[Message]:
        msgs = _messages(i)
        if i in written:
            msgs[2].tool_calls[0].function.arguments = written[i]
        return msgs

    info, rows, _, _ = setup(messages=messages, tools_json=json.dumps([BASH]))
    assert info["stats"]["malformed_tool_calls"] == 2
    assert (rows["r0"].malformed_tool_calls, rows["r1"].malformed_tool_calls, rows["r3"].malformed_tool_calls) == (0, 1, 1)
    loaded = {r["rollout_id"]: r for r in datasets.load_dataset("parquet", data_files=info["path"], split="train")}
    assert loaded["r0"]["tools"] == [BASH] and loaded["r1"]["tools"] == [BASH]
    args = {rid: r["messages"][2]["tool_calls"][0]["function"]["arguments"] for rid, r in loaded.items()}
    assert args["r0"] == {"command": "cat f0"} and args["r2"] == {"command": "cat f2"}
    assert args["r1"] == "cat f1" and args["r3"] == '["cat", "f3"]'  # what the model wrote, as a string
    assert json.loads(loaded["r0"]["tools_json"]) == [BASH]  # (kept one release for compatibility)


def test_atif_documents_validate_and_keep_calls_results_and_what_the_model_wrote(setup):
    """Issue 31 item 6: an exported trajectory as an ATIF v1.8 document (`trajforge export --format atif`),
    read back through the `atif` package's own models: system and user steps, an agent step per model
    turn with its calls' arguments as objects and the tool results as its observation; a malformed call
    keeps what the model wrote in `extra.raw_arguments`."""
    import pyarrow.parquet as pq
    from atif import Trajectory

    from trajforge.tasks.dataset.atif import atif_documents

    def messages(i: int) -> list[Message]:
        msgs = _messages(i)
        if i == 1:
            msgs[2].tool_calls[0].function.arguments = "cat f1"
        return msgs

    info, _, _, _ = setup(messages=messages, tools_json=json.dumps([BASH]))
    docs = dict(atif_documents(pq.read_table(info["path"]).to_pylist()))
    assert sorted(docs) == ["r0", "r1", "r2", "r3"]
    for rid, doc in docs.items():
        t = Trajectory.model_validate_json(json.dumps(doc))
        assert t.schema_version == "ATIF-v1.8" and t.agent.tool_definitions == [BASH]
        assert [s.source for s in t.steps] == ["system", "user", "agent"]
        agent = t.steps[2]
        assert agent.observation.results[0].source_call_id == agent.tool_calls[0].tool_call_id == "c1"
        assert agent.observation.results[0].content == f"[exit code 0]\n{rid[1:]}"
        assert t.extra["rollout_id"] == rid and t.extra["env_id"] == f"e{int(rid[1:]) % 2}"
    assert docs["r0"]["steps"][2]["tool_calls"][0]["arguments"] == {"command": "cat f0"}
    bad = docs["r1"]["steps"][2]["tool_calls"][0]
    assert bad["arguments"] == {} and bad["extra"] == {"raw_arguments": "cat f1"}
    assert docs["r1"]["extra"]["malformed_tool_calls"] == 1


def test_a_part_with_no_row_left_and_columns_with_no_chunk_keep_their_json_types(setup):
    """Every rollout filtered out: the shard writes an empty part of the export schema (JSON columns
    included: pyarrow cannot build them empty from the schema alone), and the column helpers take a
    JSON-typed column of zero chunks (what a derived config of zero rows hands them)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from trajforge.schemas.arrow import arrow_schema
    from trajforge.tasks.dataset.columns import train_mask
    from trajforge.tasks.export import content_hashes
    from trajforge.tasks.redaction.secrets import marked_rows

    info, rows, rejects, _ = setup(min_act_verify_share=1.0)  # (no rollout acts and verifies only)
    assert rows == {} and set(rejects.values()) == {"filter_low_act_verify_share", "unverified", "no_verdict"}
    part = pq.read_table(info["path"])
    assert part.num_rows == 0 and part.schema.field("tools").type == pa.list_(pa.json_())
    empty = pa.chunked_array([], arrow_schema(TrajectoryRow).field("messages").type)
    assert len(train_mask(empty)) == len(content_hashes(empty)) == len(marked_rows(empty)) == 0
