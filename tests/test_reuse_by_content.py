"""Reuse is keyed on what the upstream stage wrote, not only on its fingerprint (issue 45), in the engine
(real prepare / execute_shard / commit on real Parquet, no Docker): a forced re-run that writes other rows
changes every downstream fingerprint, one that writes the same rows (measurements aside) changes none; a
committed part changed after its commit is never reused; a manifest written before digests existed is
reused and counts by the digest of its parts. The builds through the flow are in test_rerun_downstream.py."""

from __future__ import annotations

import posixpath

import pyarrow as pa
import pytest
from helpers import run_stage, small_config

from trajforge.schemas.arrow import to_table
from trajforge.schemas.build import BuildRecord
from trajforge.schemas.config import parse_config
from trajforge.schemas.environment import EnvSpec
from trajforge.schemas.trajectory import Message, Rollout, Step, TurnUsage
from trajforge.tasks.agent.harness import HARNESS, rollout_id
from trajforge.tasks.calibrate import CalibrateStage
from trajforge.tasks.engine import Manifest, ShardResult, StageContext, commit, execute_shard, prepare
from trajforge.tasks.engine.digest import table_digest
from trajforge.tasks.envs.families import get_family
from trajforge.tasks.rollout import RolloutStage


class WordRollout(RolloutStage):
    """The rollout stage with episodes made up in-process: each says `self.word`; its timings grow with
    every run (what a re-run that made the same rows looks like)."""

    def __init__(self, word: str = "same"):
        self.word, self.runs = word, 0

    def run_shard(self, ctx, shard, upstream):
        self.runs += 1
        rows = []
        for env_id, sample, ti in (tuple(e) for e in shard.payload["episodes"]):
            label = ctx.config.teachers[ti].label
            rows.append(Rollout(
                rollout_id=rollout_id(env_id, label, sample), env_id=env_id, teacher=label, harness=HARNESS,
                sample=sample, status="ok", turns=1, wall_s=float(self.runs),
                messages=[Message(role="assistant", content=f"say {self.word}")],
                steps=[Step(turn=1, command=f"echo {self.word}", exit_code=0, duration_s=0.1 * self.runs)],
                usage=[TurnUsage(turn=1, latency_s=0.2 * self.runs, endpoint=f"http://127.0.0.1:{8000 + self.runs}")]))
        return ShardResult(rows, [], {"episodes": len(rows)})


def _ctx(config, build_id: str) -> StageContext:
    ctx = StageContext.create(config, build_id)
    ctx.store.write_build(BuildRecord(build_id=build_id, dataset=config.dataset, created_at=""))
    return ctx


def _downstream_fp(ctx, rollout: Manifest, synth: Manifest) -> str:
    """The fingerprint calibrate would have reading `rollout` (as its verify input: only the key matters)."""
    return prepare(CalibrateStage(), ctx, {"verify": rollout, "synthesize": synth}, plan_shards=False).fingerprint


@pytest.fixture
def setup(tmp_path):
    cfg = parse_config(small_config(tmp_path / "runs", dataset="content", **{
        "synthesize.families": [{"name": "log_report", "levels": [1], "seeds": [0, 1]}],
        "rollout.samples_per_env": 2, "rollout.episodes_per_shard": 2}))
    ctx = _ctx(cfg, "b1")
    part = posixpath.join(ctx.store.root, "upstream", "envs.parquet")
    ctx.store.write_records(part, EnvSpec, [get_family("log_report").generate(1, s) for s in range(2)])
    synth = Manifest(stage="synthesize", fingerprint="up", build_id="b0", dir=posixpath.dirname(part), parts=[part],
                     rows=2, rejects=0, reject_reasons={}, stats={}, components={}, gate={}, created_at="", digest="e0")
    return cfg, ctx, {"synthesize": synth}


def test_a_forced_rerun_with_other_rows_changes_what_downstream_hashes(setup):
    cfg, ctx, up = setup
    _, first = run_stage(WordRollout("alpha"), ctx, up)
    plan, second = run_stage(WordRollout("beta"), _ctx(cfg, "b2"), up, force=True)
    assert second.fingerprint == first.fingerprint, "same config, code and input: same fingerprint"
    assert second.digest and second.digest != first.digest
    assert _downstream_fp(ctx, second, up["synthesize"]) != _downstream_fp(ctx, first, up["synthesize"])
    again, _ = run_stage(WordRollout("gamma"), _ctx(cfg, "b3"), up)
    assert again.reused is not None and again.reused.build_id == "b2", "the newest copy of a fingerprint is reused"


def test_a_forced_rerun_with_the_same_rows_lets_downstream_be_reused(setup):
    cfg, ctx, up = setup
    stage = WordRollout("alpha")
    _, first = run_stage(stage, ctx, up)
    _, second = run_stage(stage, _ctx(cfg, "b2"), up, force=True)  # other timings, endpoints: measurements
    rows = [ctx.store.read_table(m.parts, Rollout) for m in (first, second)]
    assert rows[0].column("wall_s") != rows[1].column("wall_s"), "the re-run really ran again"
    assert second.digest == first.digest
    assert _downstream_fp(ctx, second, up["synthesize"]) == _downstream_fp(ctx, first, up["synthesize"])


def test_a_part_changed_after_its_commit_is_never_reused(setup):
    cfg, ctx, up = setup
    stage = WordRollout("alpha")
    _, first = run_stage(stage, ctx, up)
    victim = first.parts[0]
    table = ctx.store.read_table([victim], Rollout)
    edited = table.set_column(table.schema.get_field_index("status"), "status",
                              pa.array(["max_turns"] * table.num_rows))
    ctx.store.write_table(victim, edited)  # same fingerprint, other bytes
    later = _ctx(cfg, "b2")
    plan = prepare(stage, later, up)
    assert plan.reused is None and plan.pending == plan.shards, "the whole stage runs again"
    assert plan.note and "changed after its commit" in plan.note and posixpath.basename(victim) in plan.note
    with pytest.raises(RuntimeError, match=f"changed after its commit.*{posixpath.basename(victim)}"):
        prepare(stage, later, up, plan_shards=False)  # never read downstream as it is

    # this build's own changed copy: redone from nothing (its markers would keep the edited part)
    plan = prepare(stage, ctx, up)
    assert plan.reused is None and plan.pending == plan.shards
    for s in plan.pending:
        execute_shard(stage, ctx, plan.dir, s, up)
    redone = commit(stage, ctx, plan, up)
    assert redone.digest == first.digest and set(ctx.store.read_table(redone.parts, Rollout).column("status").to_pylist()) == {"ok"}


def test_a_manifest_from_before_digests_is_reused_by_the_digest_of_its_parts(setup):
    cfg, ctx, up = setup
    stage = WordRollout("alpha")
    _, first = run_stage(stage, ctx, up)
    path = posixpath.join(first.dir, "manifest.json")
    old = ctx.store.read_json(path)
    del old["digest"], old["files"]  # as written before issue 45
    ctx.store.write_json(path, old)
    plan, reused = run_stage(stage, _ctx(cfg, "b2"), up)
    assert plan.reused is not None and reused.digest == first.digest


def test_the_digest_leaves_out_measurements_and_tar_mtimes_only():
    import io
    import tarfile

    def tar(mtime: int, body: bytes = b"42\n") -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as t:
            info = tarfile.TarInfo("answer.txt")
            info.size, info.mtime = len(body), mtime
            t.addfile(info, io.BytesIO(body))
        return buf.getvalue()

    def row(**kw) -> Rollout:
        base = dict(rollout_id="r", env_id="e", teacher="t", harness=HARNESS, sample=0, status="ok",
                    messages=[Message(role="user", content="hi")], final_state=tar(1),
                    steps=[Step(turn=1, command="ls", exit_code=0, duration_s=0.1)], wall_s=1.0)
        return Rollout(**{**base, **kw})

    d = lambda *rows: table_digest(to_table(Rollout, list(rows)), Rollout)  # noqa: E731
    same = d(row())
    assert d(row(wall_s=9.0, final_state=tar(99),
                 steps=[Step(turn=1, command="ls", exit_code=0, duration_s=7.0)])) == same
    for other in (row(final_state=tar(1, b"41\n")), row(status="max_turns"), row(messages=[]),
                  row(steps=[Step(turn=1, command="pwd", exit_code=0, duration_s=0.1)])):
        assert d(other) != same
    assert d(row(), row(sample=1)) != d(row(sample=1), row()), "order is content"
    t = to_table(Rollout, [row(), row(sample=1)])
    assert table_digest(pa.concat_tables([t.slice(0, 1), t.slice(1, 1)]), Rollout) == d(row(), row(sample=1))
