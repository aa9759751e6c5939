import pyarrow as pa
import pytest
from pydantic import BaseModel

from trajforge.schemas.arrow import arrow_schema, from_table, to_table
from trajforge.schemas.calibration import Calibration
from trajforge.schemas.common import FileSpec, Reject
from trajforge.schemas.environment import EnvSpec
from trajforge.schemas.export import TrajectoryRow
from trajforge.schemas.trajectory import FunctionCall, Message, Rollout, Step, ToolCall, TurnUsage
from trajforge.schemas.verdict import HackFlag, Quality, TestResult, Verdict


def _rollout() -> Rollout:
    call = ToolCall(id="c1", function=FunctionCall(name="bash", arguments='{"command": "ls"}'))
    return Rollout(rollout_id="r1", env_id="e1", teacher="t", harness="h", sample=0,
                   messages=[Message(role="system", content="s"), Message(role="assistant", tool_calls=[call]),
                             Message(role="tool", tool_call_id="c1", name="bash", content="[exit code 0]\nx")],
                   steps=[Step(turn=1, command="ls", exit_code=0, duration_s=0.1)],
                   usage=[TurnUsage(turn=1, prompt_tokens=5, completion_tokens=3)], status="ok",
                   final_state=b"\x00tar")


RECORDS = [
    _rollout(),
    EnvSpec(env_id="e", family="f", level=1, seed=0, instruction="do it", files=[FileSpec(path="a", content="b")],
            tests=[FileSpec(path="test_x.py", content="def test_a(): pass")], solution=["true"], image="img"),
    Verdict(rollout_id="r", env_id="e", teacher="t", sample=0, status="ok", verified=True, reward=0.5,
            tests=[TestResult(name="a", passed=True), TestResult(name="b", passed=False, message="no")],
            hack_flags=["forge_reward"], hacks=[HackFlag(kind="forge_reward", turn=2, command="echo 1 > reward.txt")],
            quality=Quality(labels=["inspect", "act"], act_steps=1, inspect_before_act=True)),
    Calibration(env_id="e", family="f", level=1, teacher="t", attempts=2, passes=1, excluded=0, solve_rate=0.5,
                ci_low=0.1, ci_high=0.9, label="medium", certain=False),
    Reject(key="k", reason="why", detail="d"),
]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_round_trip_through_arrow(record):
    model = type(record)
    table = to_table(model, [record])
    assert table.schema.equals(arrow_schema(model), check_metadata=False)
    assert from_table(model, table) == [record]


def test_schema_is_derived_from_fields():
    schema = arrow_schema(Rollout)
    assert schema.field("final_state").type == pa.large_binary()
    msg = schema.field("messages").type.value_type
    assert msg.field("tool_calls").type.value_type.field("function").type.field("arguments").type == pa.string()
    assert schema.field("error").nullable and not schema.field("rollout_id").nullable
    assert set(arrow_schema(TrajectoryRow).names) == set(TrajectoryRow.model_fields)


def test_free_form_dict_is_refused():
    class Bad(BaseModel):
        meta: dict

    with pytest.raises(TypeError, match="Bad.meta"):
        arrow_schema(Bad)


def test_bad_status_is_refused():
    with pytest.raises(ValueError):
        Rollout(rollout_id="r", env_id="e", teacher="t", harness="h", sample=0, messages=[], status="crashed")


def test_parquet_written_before_a_field_existed_reads_back_with_its_default(tmp_path):
    """Committed outputs of older versions stay readable: a column added later (here
    `tool_call_errors`) is missing from their Parquet; the reader's nulls become the field's default."""
    import pyarrow.parquet as pq

    from trajforge.schemas.arrow import arrow_schema, from_table, to_table
    from trajforge.schemas.trajectory import Rollout

    r = Rollout(rollout_id="x", env_id="e", teacher="t", harness="h", sample=0, messages=[], status="ok",
                tool_call_errors=2)
    pq.write_table(to_table(Rollout, [r]).drop_columns(["tool_call_errors"]), tmp_path / "old.parquet")
    back = from_table(Rollout, pq.read_table(tmp_path / "old.parquet", schema=arrow_schema(Rollout)))
    assert back[0].tool_call_errors == 0 and back[0].rollout_id == "x" and back[0].error is None


def test_turn_usage_written_before_the_prompt_ids_existed_reads_back(tmp_path):
    """A rollout part written before `TurnUsage` kept prompt ids (nested struct fields added later) reads
    back under today's schema with those fields null, as `trajforge stage export` on an older build does."""
    import pyarrow.parquet as pq

    from trajforge.tasks.teachers.tokens import assemble

    r = Rollout(rollout_id="x", env_id="e", teacher="t", harness="h", sample=0, messages=[], status="ok",
                usage=[TurnUsage(turn=1, prompt_tokens=3, completion_tokens=2, latency_s=0.1,
                                 completion_token_ids=[7, 8])])
    t = to_table(Rollout, [r])
    usage = t.column("usage").combine_chunks()
    old_turn = pa.struct([f for f in usage.type.value_type if f.name not in ("prompt_shared_len", "prompt_new_token_ids")])
    flat = usage.flatten()
    old = pa.ListArray.from_arrays(usage.offsets, pa.StructArray.from_arrays(
        [flat.field(f.name) for f in old_turn], fields=list(old_turn)))
    pq.write_table(t.set_column(t.schema.get_field_index("usage"), "usage", old), tmp_path / "old.parquet")
    back = from_table(Rollout, pq.read_table(tmp_path / "old.parquet", schema=arrow_schema(Rollout)))
    turn = back[0].usage[0]
    assert turn.completion_token_ids == [7, 8]
    assert turn.prompt_shared_len is None and turn.prompt_new_token_ids is None
    assert assemble(back[0].usage).prefix_preserving is None  # no prompt ids: nothing claimed
