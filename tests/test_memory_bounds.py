"""Memory bounded by a shard, not the dataset (issue 15, item 8), shown by what is read:
the gate reads only the scalar columns its suite names (same verdicts as on the whole table), a
shard loads only its own environments, and export derives its configs chunk by chunk with the
same rows, order and files as from the whole table (and `datasets` loads them)."""

from __future__ import annotations

import posixpath
from pathlib import Path

import pyarrow as pa
import pytest

from trajforge.expectations.gate import gate_columns, run_gate
from trajforge.schemas.arrow import arrow_schema, to_table
from trajforge.schemas.calibration import Calibration
from trajforge.schemas.config import load_config
from trajforge.schemas.environment import EnvSpec, FileSpec
from trajforge.schemas.export import TrajectoryRow
from trajforge.schemas.trajectory import Message, Rollout
from trajforge.schemas.verdict import Verdict
from trajforge.tasks.calibrate import CalibrateStage
from trajforge.tasks.engine import GateFailed, Manifest, Shard, ShardResult, StageContext, StagePlan, commit
from trajforge.tasks.envs.catalogue import load_envs
from trajforge.tasks.export import ExportStage, preference, rl, sft
from trajforge.tasks.rollout import RolloutStage
from trajforge.tasks.verify import VerifyStage

ROOT = Path(__file__).resolve().parent.parent
BIG = ("messages", "final_state", "outside_state", "steps")


@pytest.fixture
def ctx(tmp_path):
    def make(**overrides) -> StageContext:
        cfg = load_config(ROOT / "configs/replay.yaml", {"runs": str(tmp_path / "runs"), "dataset": "mem", **overrides})
        return StageContext.create(cfg, "b")
    return make


class ReadSpy:
    """Records every `store.read_table` call: (paths, columns, filters)."""

    def __init__(self, monkeypatch, store):
        self.calls: list[tuple[list[str], list[str] | None, list | None]] = []
        real = store.read_table

        def spy(paths, model=None, columns=None, filters=None):
            self.calls.append((list(paths), columns, filters))
            return real(paths, model, columns=columns, filters=filters)
        monkeypatch.setattr(store, "read_table", spy)

    def of(self, paths: list[str]) -> list[tuple[list[str], list[str] | None, list | None]]:
        return [c for c in self.calls if set(c[0]) & set(paths)]


def _manifest(store, name: str, model, rows) -> Manifest:
    path = posixpath.join(store.root, "up", name, "part-00000.parquet")
    store.write_records(path, model, rows)
    return Manifest(stage=name, fingerprint="x", build_id="b", dir=posixpath.dirname(path), parts=[path],
                    rows=len(rows), rejects=0, reject_reasons={}, stats={}, components={}, gate={}, created_at="")


def _env(i: int) -> EnvSpec:
    return EnvSpec(env_id=f"e{i}", family="fam", level=1 + i % 3, seed=i, instruction=f"task {i}",
                   tests=[FileSpec(path="test_x.py", content="def test_a(): pass")], solution=["true"],
                   image=f"trajforge/env:{i:016x}")


def _rollout(i: int, rid: str | None = None) -> Rollout:
    return Rollout(rollout_id=rid or f"r{i}", env_id=f"e{i % 3}", teacher="t", harness="h", sample=i,
                   messages=[Message(role="user", content="x" * 1000)], status="ok", turns=1,
                   final_state=b"\0" * 100_000)


# -- the gate ---------------------------------------------------------------------------------------

def test_gate_columns_are_the_scalar_columns_the_suite_names():
    schema = arrow_schema(Rollout)
    assert gate_columns("rollout", schema) == ["rollout_id", "env_id", "teacher", "completion_tokens", "turns", "status"]
    extra = [{"type": "expect_column_values_to_be_between", "kwargs": {"column": "wall_s", "min_value": 0}},
             {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "messages"}}]
    cols = gate_columns("rollout", schema, extra)
    assert "wall_s" in cols and not set(cols) & set(BIG)
    # an expectation on the column set sees every scalar column, as before; nested ones never reach GX
    whole = gate_columns("rollout", schema, [{"type": "expect_table_column_count_to_be_between",
                                              "kwargs": {"min_value": 1}}])
    assert "error" in whole and "attempts" in whole and not set(whole) & set(BIG)
    assert gate_columns("calibrate", arrow_schema(Calibration)) == ["env_id", "teacher", "attempts", "passes",
                                                                     "harness", "solve_rate", "ci_low", "ci_high", "label",
                                                                     "label_confidence", "pooled_label",
                                                                     "pooled_solve_rate"]
    assert gate_columns("export", arrow_schema(TrajectoryRow)) == ["rollout_id", "status", "reward", "turns",
                                                                    "solve_rate"]


def test_gate_on_the_projection_gives_the_whole_table_verdict():
    table = to_table(Rollout, [_rollout(0), _rollout(1, rid="r0"), _rollout(2)])
    table = table.set_column(table.schema.get_field_index("status"), "status", pa.array(["ok", "ok", "bogus"]))
    extra = [{"type": "expect_column_values_to_be_between", "kwargs": {"column": "turns", "max_value": 0}}]
    whole = run_gate("rollout", table, {"rows": 3}, extra)
    part = run_gate("rollout", table.select(gate_columns("rollout", table.schema, extra)), {"rows": 3}, extra)
    assert not whole["success"] and len(whole["failures"]) == 3  # unique id, status set, turns
    assert [(f["expectation"], f["unexpected"]) for f in part["failures"]] == \
        [(f["expectation"], f["unexpected"]) for f in whole["failures"]]


def test_commit_reads_only_the_scalar_columns_of_the_output(ctx, monkeypatch):
    c, stage = ctx(), RolloutStage()
    plan_dir = c.store.stage_dir("b", "rollout", "fp")
    shards = [Shard(index=i) for i in range(2)]
    for s in shards:
        rows = [_rollout(2 * s.index + k) for k in range(2)]
        c.store.write_records(posixpath.join(plan_dir, f"{s.name}.parquet"), Rollout, rows)
        c.store.write_json(posixpath.join(plan_dir, "_done", s.name),
                           {"shard": s.name, "part": f"{s.name}.parquet", "rows": 2, "rejects": 0, "stats": {},
                            "seconds": 0.1, "digest": f"d{s.index}"})  # (a shard's marker carries its digest)
    parts = [posixpath.join(plan_dir, f"{s.name}.parquet") for s in shards]
    spy = ReadSpy(monkeypatch, c.store)
    manifest = commit(stage, c, StagePlan("rollout", "fp", {}, plan_dir, None, shards, []))
    assert manifest.rows == 4 and manifest.gate["success"]
    reads = spy.of(parts)
    assert reads and all(cols is not None and not set(cols) & set(BIG) for _, cols, _ in reads), reads

    # the same projection still fails the gate on the offending values
    c.store.write_records(parts[1], Rollout, [_rollout(0), _rollout(3)])  # r0 twice
    with pytest.raises(GateFailed, match="expect_column_values_to_be_unique.*r0"):
        commit(stage, c, StagePlan("rollout", "fp2", {}, plan_dir, None, shards, []))


# -- shards load their own environments ---------------------------------------------------------------

def _env_reads(spy: ReadSpy, synth: Manifest) -> list[list]:
    return [filters for _, _, filters in spy.of(synth.parts)]


def test_load_envs_reads_only_the_ids_asked_for(ctx, monkeypatch):
    c = ctx()
    synth = _manifest(c.store, "synthesize", EnvSpec, [_env(i) for i in range(6)])
    spy = ReadSpy(monkeypatch, c.store)
    assert sorted(load_envs(c, synth, ["e4", "e1", "e4", "nope"])) == ["e1", "e4"]
    assert _env_reads(spy, synth) == [[("env_id", "in", ["e1", "e4", "nope"])]]
    assert load_envs(c, synth, []) == {} and len(spy.calls) == 1  # nothing to read
    assert sorted(load_envs(c, synth)) == [f"e{i}" for i in range(6)]  # no ids: the whole catalogue


def test_stage_shards_load_only_the_environments_they_need(ctx, monkeypatch):
    import trajforge.tasks.rollout as rollout_mod
    import trajforge.tasks.verify as verify_mod

    c = ctx()
    synth = _manifest(c.store, "synthesize", EnvSpec, [_env(i) for i in range(6)])
    seen: dict[str, set] = {}

    def stage_code(name: str):
        return lambda ctx, envs, _: (seen.setdefault(name, set(envs)), ShardResult([], [], {}))[1]

    monkeypatch.setattr(rollout_mod, "run_episodes", stage_code("rollout"))
    monkeypatch.setattr(verify_mod, "verify_rollouts", stage_code("verify"))
    for mod in (rollout_mod, verify_mod):  # images onto this engine: not what this test is about
        monkeypatch.setattr(mod, "bring_all_here", lambda ctx, envs: {"images_present": len(list(envs))})
    spy = ReadSpy(monkeypatch, c.store)

    RolloutStage().run_shard(c, Shard(index=0, payload={"episodes": [["e2", 0, 0], ["e2", 1, 0], ["e5", 0, 0]]}),
                             {"synthesize": synth})
    rollouts = _manifest(c.store, "rollout", Rollout, [_rollout(i) for i in range(6)])
    VerifyStage().run_shard(c, Shard(index=0, payload={"env_ids": ["e1"]}), {"synthesize": synth, "rollout": rollouts})
    verdicts = [Verdict(rollout_id=f"r{i}", env_id=f"e{i % 2}", teacher="t", sample=i, status="ok", verified=True,
                        passed=i < 2) for i in range(4)]
    result = CalibrateStage().run_shard(c, Shard(index=0), {"synthesize": synth,
                                                            "verify": _manifest(c.store, "verify", Verdict, verdicts)})
    assert seen == {"rollout": {"e2", "e5"}, "verify": {"e1"}}
    assert [r.env_id for r in result.rows] == ["e0", "e1"] and result.rows[1].level == 2
    assert _env_reads(spy, synth) == [[("env_id", "in", ["e2", "e5"])], [("env_id", "in", ["e1"])],
                                      [("env_id", "in", ["e0", "e1"])]]


# -- export streams its derived configs ---------------------------------------------------------------

def _traj(i: int, env: str, passed: bool, system: str = "s", status: str = "ok") -> TrajectoryRow:
    msgs = [Message(role="system", content=system), Message(role="user", content=f"task {env}"),
            Message(role="assistant", content=f"```bash\necho {i}\n```" + "y" * 500)]
    return TrajectoryRow(rollout_id=f"r{i:03d}", env_id=env, family="fam", level=1, teacher="t", harness="h",
                         sample=i, messages=msgs, tools_json="[]", status=status, passed=passed, reward=float(passed),
                         tests_passed=int(passed), tests_total=1, hack_flags=[], step_labels=[],
                         inspect_before_act=False, act_verify_share=0.0, ends_with_verify=False, repeated_commands=0,
                         failed_commands=0, recoveries=0, turns=1, prompt_tokens=1, completion_tokens=1, wall_s=0.1,
                         difficulty="medium", solve_rate=0.5)


def test_export_streams_configs_with_the_rows_and_files_of_the_whole_table(ctx, monkeypatch, tmp_path):
    import datasets

    c = ctx(**{"export.rows_per_shard": 3})
    store, fp = c.store, "feedc0ffee"
    out_dir = store.stage_dir("b", "export", fp)
    # 4 parts; environments spread over parts (as adaptive rounds do), one with a second prompt,
    # an infra failure that never pairs, an environment with only successes
    rows = [_traj(i, f"e{i % 5}", passed=i % 3 == 0, system="s" if i % 7 else "other",
                  status="infra_error" if i == 13 else "ok") for i in range(24)]
    parts = []
    for k in range(4):
        parts.append(posixpath.join(out_dir, "trajectories", f"train-{fp}-{k:05d}.parquet"))
        store.write_records(parts[-1], TrajectoryRow, rows[6 * k:6 * k + 6])
    calib = [Calibration(env_id=f"e{i}", family="fam", level=1, teacher="t", attempts=4, passes=i % 3, excluded=0,
                         solve_rate=0.5, ci_low=0.1, ci_high=0.9, label="medium", certain=True) for i in range(5)]
    up = {"synthesize": _manifest(store, "synthesize", EnvSpec, [_env(i) for i in range(8)]),
          "calibrate": _manifest(store, "calibrate", Calibration, calib)}
    store.write_table(posixpath.join(out_dir, "preference", f"train-{fp}-00099.parquet"), pa.table({"x": [1]}))  # stale

    spy = ReadSpy(monkeypatch, store)
    stats = {"rows": 24}
    ExportStage().finalize(c, out_dir, stats, up)
    reads = spy.of(parts)

    whole = store.read_table(parts, TrajectoryRow)
    expected = {"sft": sft(c, whole, up), "rl": rl(c, whole, up), "preference": preference(c, whole, up)}
    assert expected["sft"].num_rows == 8 and expected["preference"].num_rows >= 4 and expected["rl"].num_rows == 3
    for name, want in expected.items():
        files = sorted(store.fs.glob(posixpath.join(out_dir, name, "*.parquet")))
        got = [store.read_table([f]) for f in files]
        assert [t.num_rows for t in got] == [min(3, want.num_rows - s) for s in range(0, want.num_rows, 3)], name
        assert pa.concat_tables(got).to_pylist() == want.to_pylist(), name
    assert stats["configs"] == {"trajectories": 24, **{n: t.num_rows for n, t in expected.items()}}

    # messages were read one part at a time, or for a group of environments (never all of them at once)
    assert reads
    for paths, cols, filters in reads:
        if cols is None or "messages" in cols:
            assert len(paths) == 1 or (filters and len(filters[0][2]) < 5), (paths, cols, filters)

    sft_ds = datasets.load_dataset(out_dir, "sft", cache_dir=str(tmp_path / "hf"))["train"]
    assert sft_ds["rollout_id"] == expected["sft"].column("rollout_id").to_pylist()
    pref = datasets.load_dataset(out_dir, "preference", cache_dir=str(tmp_path / "hf"))["train"]
    assert pref["chosen_id"] == expected["preference"].column("chosen_id").to_pylist()


def test_export_gate_failure_keeps_the_config_files_for_inspection_and_writes_no_card(ctx, monkeypatch):
    import trajforge.tasks.export as export_mod

    c = ctx(**{"export.rows_per_shard": 2, "export.configs": ["sft"]})
    store, fp = c.store, "0badc0de"
    out_dir = store.stage_dir("b", "export", fp)
    part = posixpath.join(out_dir, "trajectories", f"train-{fp}-00000.parquet")
    store.write_records(part, TrajectoryRow, [_traj(i, "e0", passed=True) for i in range(5)])
    twice = lambda ctx, t, up: pa.concat_tables([sft(ctx, t, up)] * 2)  # noqa: E731 (duplicate rollout ids)
    monkeypatch.setattr(export_mod, "sft", twice)
    with pytest.raises(GateFailed, match="sft"):
        ExportStage().finalize(c, out_dir, {}, {})
    # issue 16: the partial output stays on disk for inspection; without a card nothing declares it
    assert store.fs.glob(posixpath.join(out_dir, "sft", "*.parquet"))
    assert not store.exists(posixpath.join(out_dir, "README.md"))
    assert to_table(TrajectoryRow, store.read_table([part])).num_rows == 5
