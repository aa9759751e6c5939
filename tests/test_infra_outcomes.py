"""Infrastructure outcomes are never final (issue 15, item 1).

- The engine (real prepare / execute_shard / commit on real Parquet, no Docker): a stage whose
  share of infrastructure outcomes exceeds `gate.max_infra_share` commits nothing and names the
  share and the first errors; the next run re-runs exactly those rows and keeps the others; a
  committed output is reopened by `retry` (what `trajforge rerun` does) with a new revision.
- Calibration labels an (environment, teacher) pair with no model-final attempt `unlabelled`.
- Real builds (Docker, the Prefect flow, a replay teacher that is down for some episodes): the
  gate fails with nothing committed, the resume re-runs only the failed episodes; a committed
  rollout holding infrastructure rows is `unlabelled` in calibration until `rerun` fixes it.
"""

from __future__ import annotations

import json
import posixpath
from pathlib import Path

import pytest
from helpers import run_stage, small_config

from trajforge.schemas.calibration import Calibration, RoundPlan
from trajforge.schemas.config import parse_config
from trajforge.schemas.environment import EnvSpec
from trajforge.schemas.trajectory import Message, Rollout
from trajforge.schemas.verdict import Verdict
from trajforge.tasks.agent.harness import HARNESS, rollout_id
from trajforge.tasks.calibrate import CalibrateStage
from trajforge.tasks.engine import GateFailed, Manifest, ShardResult, StageContext, execute_shard, prepare
from trajforge.tasks.envs.families import get_family
from trajforge.tasks.rollout import RolloutStage

INFRA = {"teacher_error", "infra_error"}


def _manifest(stage: str, parts: list[str], fp: str = "up") -> Manifest:
    return Manifest(stage=stage, fingerprint=fp, build_id="b0", dir="", parts=parts, rows=0, rejects=0,
                    reject_reasons={}, stats={}, components={}, gate={}, created_at="")


class FakeRollout(RolloutStage):
    """The rollout stage with episodes made up in-process (no Docker): an episode of a sample in
    `down` ends `teacher_error`; every episode run is logged in `ran`."""

    def __init__(self):
        self.down: set[int] = set()
        self.ran: list[tuple[str, int]] = []
        self.runs = 0

    def _episodes(self, ctx, episodes) -> ShardResult:
        self.runs += 1
        rows = []
        for env_id, sample, ti in episodes:
            self.ran.append((env_id, sample))
            label = ctx.config.teachers[ti].label
            bad = sample in self.down
            rows.append(Rollout(rollout_id=rollout_id(env_id, label, sample), env_id=env_id, teacher=label,
                                harness=HARNESS, sample=sample, wall_s=float(self.runs), turns=0 if bad else 1,
                                messages=[Message(role="user", content=f"run {self.runs}")],
                                status="teacher_error" if bad else "ok",
                                error=f"TeacherError: endpoint down for sample {sample}\ntrace" if bad else None))
        return ShardResult(rows, [], {"episodes": len(rows), "completion_tokens": 10 * len(rows)})

    def run_shard(self, ctx, shard, upstream):
        return self._episodes(ctx, [tuple(e) for e in shard.payload["episodes"]])

    def retry_shard(self, ctx, shard, upstream, rows, rejects):  # the same contract as the real one
        index = {t.label: i for i, t in enumerate(ctx.config.teachers)}
        return self._episodes(ctx, [(e, k, index[t]) for e, k, t in zip(
            rows.column("env_id").to_pylist(), rows.column("sample").to_pylist(), rows.column("teacher").to_pylist())])


def _ctx(config, build_id: str) -> StageContext:
    """A context of a build that exists (has its build.json, which is what reuse looks for)."""
    from trajforge.schemas.build import BuildRecord

    ctx = StageContext.create(config, build_id)
    ctx.store.write_build(BuildRecord(build_id=build_id, dataset=config.dataset, created_at=""))
    return ctx


def _rows(store, manifest_or_dir) -> dict[str, dict]:
    parts = manifest_or_dir.parts if isinstance(manifest_or_dir, Manifest) else sorted(
        str(p) for p in Path(manifest_or_dir).glob("part-*.parquet"))
    return {r["rollout_id"]: r for r in store.read_table(parts, Rollout).to_pylist()}


@pytest.fixture
def rollout_ctx(tmp_path):
    cfg = parse_config(small_config(tmp_path / "runs", dataset="infra", **{
        "synthesize.families": [{"name": "log_report", "levels": [1], "seeds": [0, 1, 2]}],
        "rollout.samples_per_env": 2, "rollout.episodes_per_shard": 2}))
    ctx = _ctx(cfg, "b1")
    envs = [get_family("log_report").generate(1, s) for s in range(3)]
    part = posixpath.join(ctx.store.root, "upstream", "envs.parquet")
    ctx.store.write_records(part, EnvSpec, envs)
    return ctx, {"synthesize": _manifest("synthesize", [part])}


def test_gate_fails_above_the_share_then_resume_reruns_only_the_infra_rows(rollout_ctx):
    ctx, upstream = rollout_ctx
    stage = FakeRollout()
    stage.down = {1}  # the teacher is down for every second episode: 3 of 6
    with pytest.raises(GateFailed) as err:
        run_stage(stage, ctx, upstream)
    msg = str(err.value)
    assert "3 of 6 outputs (50.0%) exceed gate.max_infra_share 5.0%" in msg
    assert "first errors: TeacherError: endpoint down for sample 1" in msg and "trace" not in msg
    plan = prepare(stage, ctx, upstream)
    assert plan.reused is None and not ctx.store.exists(posixpath.join(plan.dir, "manifest.json"))
    assert [s.name for s in plan.pending] == [s.name for s in plan.shards], "every shard holds one infra row"
    markers = [ctx.store.read_json(posixpath.join(plan.dir, "_done", s.name)) for s in plan.shards]
    assert [m["retryable"] for m in markers] == [1, 1, 1]
    gate = ctx.store.read_json(posixpath.join(plan.dir, "gate.json"))
    assert gate["failures"][0]["expectation"] == "max_infra_share" and gate["failures"][0]["unexpected"] == [0.5]
    before = _rows(ctx.store, plan.dir)

    stage.down, stage.ran = set(), []  # the teacher is back
    _, manifest = run_stage(stage, ctx, upstream)
    assert sorted(stage.ran) == sorted((r["env_id"], r["sample"]) for r in before.values() if r["status"] in INFRA)
    after = _rows(ctx.store, manifest)
    assert after.keys() == before.keys() and all(r["status"] == "ok" for r in after.values())
    for rid, row in before.items():
        if row["status"] not in INFRA:
            assert after[rid] == row, "a model-final row is kept exactly as it was"
    order = [r["rollout_id"] for r in ctx.store.read_table(manifest.parts, Rollout, columns=["rollout_id"]).to_pylist()]
    assert order == sorted(before, key=list(before).index), "a re-run row takes its old place"
    assert manifest.stats["infra"] == 0 and manifest.stats["retried"] == 3 and manifest.revision == 0
    assert manifest.stats["status"] == {"ok": 6} and manifest.stats["episodes"] == 6
    assert manifest.stats["completion_tokens"] == 90, "costs of both runs are kept"

    stage.ran = []
    assert run_stage(stage, ctx, upstream)[0].reused is not None and stage.ran == [], "committed: reused as is"


def test_committed_infra_rows_are_rerun_on_request_with_a_new_revision(rollout_ctx):
    ctx, upstream = rollout_ctx
    ctx.config.gate.max_infra_share = 0.5
    stage = FakeRollout()
    stage.down = {1}
    _, first = run_stage(stage, ctx, upstream)
    assert first.stats["infra"] == 3 and first.stats["infra_share"] == 0.5 and first.revision == 0
    downstream_fp = prepare(CalibrateStage(), ctx, {"verify": first, "synthesize": upstream["synthesize"]},
                        plan_shards=False).fingerprint

    stage.down, stage.ran = set(), []
    assert run_stage(stage, ctx, upstream)[0].reused is not None and stage.ran == [], "within the share: reused"
    other = _ctx(ctx.config, "b2")  # `trajforge rerun rollout --build b2`
    plan, second = run_stage(stage, other, upstream, retry=True)
    assert plan.dir != first.dir and len(stage.ran) == 3
    assert second.revision == 1 and second.stats["infra"] == 0 and second.content_id != first.content_id  # other rows: another digest
    assert ctx.store.exists(posixpath.join(first.dir, "manifest.json")), "another build's output is never changed"
    kept = {k: v for k, v in _rows(ctx.store, first).items() if v["status"] not in INFRA}
    assert all(_rows(ctx.store, second)[k] == v for k, v in kept.items())
    downstream = prepare(CalibrateStage(), other, {"verify": second, "synthesize": upstream["synthesize"]},
                         plan_shards=False).fingerprint
    assert downstream != downstream_fp, "what read the older rows runs again"

    ctx.config.gate.max_infra_share = 0.1  # a tighter threshold re-checks a committed output on reuse
    stage.down, stage.ran = {1}, []
    _, third = run_stage(stage, _ctx(ctx.config, "b3"), upstream, retry=True)
    assert stage.ran == [] and third.dir == second.dir, "nothing left to re-run: reused"


def test_verify_infra_rejects_fail_the_gate_and_their_shard_runs_again(rollout_ctx):
    """Verification's infrastructure outcomes are `verify_infra` rejects: counted against the share;
    the stage re-runs such a shard whole (its contrastive check compares an environment's rollouts)."""
    from trajforge.schemas.common import Reject
    from trajforge.tasks.verify import VerifyStage

    ctx, upstream = rollout_ctx
    rollouts = [Rollout(rollout_id=f"r{i}", env_id=f"e{i}", teacher="t", harness=HARNESS, sample=0,
                        messages=[], status="ok") for i in range(4)]
    part = posixpath.join(ctx.store.root, "upstream", "rollouts.parquet")
    ctx.store.write_records(part, Rollout, rollouts)
    upstream = {**upstream, "rollout": _manifest("rollout", [part])}

    class FakeVerify(VerifyStage):
        down, ran = True, []

        def run_shard(self, ctx, shard, upstream):
            self.ran.append(shard.name)
            rows, rejects = [], []
            for e in shard.payload["env_ids"]:
                if self.down and e == "e0":
                    rejects.append(Reject(key="r0", reason="verify_infra", detail="docker: connection reset"))
                else:
                    rows.append(Verdict(rollout_id=f"r{e[1:]}", env_id=e, teacher="t", sample=0, status="ok",
                                        verified=True))
            return ShardResult(rows, rejects, {})

    ctx.config.verify.rollouts_per_shard = 2
    stage = FakeVerify()
    with pytest.raises(GateFailed, match=r"1 of 4 outputs \(25.0%\).*first errors: r0: docker: connection reset"):
        run_stage(stage, ctx, upstream)
    stage.down, stage.ran = False, []
    _, m = run_stage(stage, ctx, upstream)
    assert stage.ran == ["part-00000"] and m.rows == 4 and m.rejects == 0 and m.stats["retried"] == 1


def _plant_lease(store, build_id: str, token: str) -> None:
    """Write the build's lease file as a driver holding `token` would have (a takeover, a new run)."""
    from trajforge.tasks.engine.lease import FILE, LeaseInfo

    store.write_json(posixpath.join(store.build_dir(build_id), FILE), LeaseInfo(
        owner="elsewhere:1:0", token=token, build_id=build_id, acquired_at=0, heartbeat_at=0, refresh_s=15
    ).model_dump(mode="json"))


class LateRollout(FakeRollout):
    """A shard that outlives its run: while it runs, `meanwhile()` happens (the lease changes hands,
    or the driver abandons the shard)."""

    meanwhile = staticmethod(lambda: None)

    def run_shard(self, ctx, shard, upstream):
        result = super().run_shard(ctx, shard, upstream)
        self.meanwhile()
        return result


def test_a_late_shard_commits_nothing_once_its_lease_is_gone_or_it_was_abandoned(rollout_ctx):
    """Issue 15 (shard watchdog): a shard keeps running in its worker after the driver gave up on it.
    Its part, rejects and `_done` marker are fenced by the lease token it was started under."""
    from trajforge.tasks.engine.lease import RUNTIME_KEY, ShardFenced, abandon

    ctx, upstream = rollout_ctx
    store = ctx.store
    _plant_lease(store, "b1", "run-1")
    ctx.runtime[RUNTIME_KEY] = "run-1"
    stage = LateRollout()
    plan = prepare(stage, ctx, upstream)
    first, second = plan.pending[:2]

    # 1. another driver took the build over while the shard ran: nothing of it is written
    stage.meanwhile = lambda: _plant_lease(store, "b1", "run-2")
    with pytest.raises(ShardFenced, match="now held by"):
        execute_shard(stage, ctx, plan.dir, first, upstream)
    assert not store.exists(posixpath.join(plan.dir, "_done", first.name))
    assert not store.exists(posixpath.join(plan.dir, f"{first.name}.parquet"))

    # 2. the driver abandoned it (dask.shard_timeout_s) under its own, still valid, token
    _plant_lease(store, "b1", "run-1")
    stage.meanwhile = lambda: abandon(store, plan.dir, second.name, "run-1", "past dask.shard_timeout_s")
    with pytest.raises(ShardFenced, match="abandoned by its driver"):
        execute_shard(stage, ctx, plan.dir, second, upstream)
    assert not store.exists(posixpath.join(plan.dir, "_done", second.name))
    assert len(stage.ran) == 4, "both shards ran to their end: only their commit was refused"

    # 3. the lease was released (the driver ended): refused as well
    store.remove(posixpath.join(store.build_dir("b1"), "lease.json"))
    stage.meanwhile = lambda: None
    with pytest.raises(ShardFenced, match="released"):
        execute_shard(stage, ctx, plan.dir, first, upstream)

    # the next run of the build (a new token) redoes both and commits every row exactly once
    _plant_lease(store, "b1", "run-3")
    ctx.runtime[RUNTIME_KEY] = "run-3"
    stage.ran = []
    plan, manifest = run_stage(stage, ctx, upstream)
    assert len(stage.ran) == 6 and manifest.rows == 6
    assert len(_rows(store, manifest)) == 6


def _calibrate(tmp_path, verdicts: list[Verdict], adaptive: dict | None = None) -> tuple[list[Calibration], RoundPlan]:
    over = {"calibrate.adaptive": adaptive} if adaptive else {}
    ctx = _ctx(parse_config(small_config(tmp_path / "runs", dataset="cal", **over)), "b1")
    envs = {v.env_id: get_family(v.env_id.split("-")[0]).generate(1, 0) for v in verdicts}
    root = ctx.store.root
    ctx.store.write_records(posixpath.join(root, "up", "envs.parquet"), EnvSpec, list(envs.values()))
    ctx.store.write_records(posixpath.join(root, "up", "verdicts.parquet"), Verdict, verdicts)
    upstream = {"synthesize": _manifest("synthesize", [posixpath.join(root, "up", "envs.parquet")]),
                "verify": _manifest("verify", [posixpath.join(root, "up", "verdicts.parquet")])}
    stage = CalibrateStage()
    _, m = run_stage(stage, ctx, upstream)
    return ctx.store.read_records(m.parts, Calibration), RoundPlan.of(m.stats)


def test_a_pair_with_only_infrastructure_outcomes_is_unlabelled(tmp_path):
    a, b = (get_family(n).generate(1, 0).env_id for n in ("log_report", "file_search"))

    def v(env, teacher, k, status, passed=False):
        return Verdict(rollout_id=f"{env}-{teacher}-{k}", env_id=env, teacher=teacher, sample=k, status=status,
                       verified=status not in INFRA, passed=passed, tests_passed=passed)

    verdicts = [v(a, "t", 0, "teacher_error"), v(a, "t", 1, "infra_error"),  # nothing model-final
                v(b, "t", 0, "ok", True), v(b, "t", 1, "max_turns"), v(a, "u", 0, "max_turns")]
    rows, plan = _calibrate(tmp_path, verdicts, {"batch": 2, "max_samples": 8})
    by = {(r.env_id, r.teacher): r for r in rows}
    none = by[(a, "t")]
    assert (none.label, none.attempts, none.excluded, none.certain) == ("unlabelled", 0, 2, False)
    assert (none.ci_low, none.ci_high) == (0.0, 1.0)
    assert by[(a, "u")].label == "unsolved" and by[(b, "t")].label == "medium"
    assert "t" in plan.unsure_teachers.get(a, []) and plan.needs_more[a] == 2, "unlabelled asks for more samples"


def test_unlabelled_reaches_the_export_schema_and_the_gates():
    from trajforge.expectations.gate import load_suite
    from trajforge.schemas.export import RLRow, TrajectoryRow

    assert "unlabelled" in RLRow.model_fields["difficulty"].annotation.__args__
    assert "unlabelled" in TrajectoryRow.model_fields["difficulty"].annotation.__args__
    label_set = next(e["kwargs"]["value_set"] for e in load_suite("calibrate")["expectations"]
                     if e["kwargs"].get("column") == "label")
    assert "unlabelled" in label_set


# -- real builds: Docker, the Prefect flow, a teacher that is down for some episodes ----------------

def _flaky_config(tmp_path: Path, dataset: str, **over) -> dict:
    teacher = {"backend": "flaky", "name": "flaky", "down_file": str(tmp_path / "down"),
               "log_file": str(tmp_path / "sessions.log"), **over.pop("teacher", {})}
    return small_config(tmp_path / "runs", dataset=dataset, plugins=["flaky_teacher"], teacher=teacher,
                        **{"rollout.samples_per_env": 2, "rollout.episodes_per_shard": 2, **over})


def _sessions(tmp_path: Path) -> list[str]:
    log = tmp_path / "sessions.log"
    return log.read_text().splitlines() if log.exists() else []


def _rollout_rows(store, stage_dir: str) -> dict[str, dict]:
    parts = sorted(store.fs.glob(posixpath.join(stage_dir, "part-*.parquet")))
    return {r["rollout_id"]: r for r in store.read_table(parts, Rollout).to_pylist()}


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_build_with_the_teacher_down_fails_its_gate_then_resumes_only_the_failed_episodes(tmp_path):
    from trajforge.flows.launch import run_build
    from trajforge.tasks.engine.store import RunStore

    cfg = _flaky_config(tmp_path, "down")
    (tmp_path / "down").touch()  # sample 1 of every environment: the teacher dies after one turn
    with pytest.raises(Exception, match=r"max_infra_share") as err:
        run_build(parse_config(cfg))
    assert "2 of 4 outputs (50.0%)" in str(err.value) and "teacher flaky is down" in str(err.value)
    store = RunStore(cfg["runs"], "down")
    (build_id,) = store.builds()
    rec = store.read_build(build_id)
    assert rec.status == "failed" and rec.stages["rollout"].status == "failed" and "verify" not in rec.stages
    rollout_dir = store.stage_dir(build_id, "rollout", rec.stages["rollout"].fingerprint)
    assert not store.exists(posixpath.join(rollout_dir, "manifest.json"))
    before = _rollout_rows(store, rollout_dir)
    failed = {k for k, r in before.items() if r["status"] == "teacher_error"}
    assert len(failed) == 2 and all(before[k]["sample"] == 1 and before[k]["turns"] >= 1 for k in failed)
    first_pass = len(_sessions(tmp_path))
    assert first_pass == 4

    (tmp_path / "down").unlink()  # the teacher is back: the same command resumes the build
    rec2 = run_build(parse_config(cfg))
    assert rec2["build_id"] == build_id and rec2["status"] == "committed"
    assert len(_sessions(tmp_path)) - first_pass == len(failed), "only the failed episodes ran again"
    after = _rollout_rows(store, rollout_dir)
    assert after.keys() == before.keys() and all(r["status"] == "ok" for r in after.values())
    for k in before.keys() - failed:
        assert after[k] == before[k], "a model-final rollout is kept byte for byte (ids, wall_s, messages)"
    manifest = json.loads((Path(rollout_dir) / "manifest.json").read_text())
    assert manifest["stats"]["infra"] == 0 and manifest["stats"]["retried"] == 2
    calib = store.read_table(Manifest.model_validate(store.read_json(posixpath.join(
        rec2["stages"]["calibrate"]["manifest"], "manifest.json"))).parts, Calibration).to_pylist()
    assert {c["label"] for c in calib} == {"trivial"} and all(c["attempts"] == 2 for c in calib)


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_committed_rollout_with_infra_rows_is_unlabelled_until_rerun(tmp_path):
    from trajforge.flows.launch import rerun_build, run_build
    from trajforge.tasks.engine.store import RunStore

    cfg = _flaky_config(tmp_path, "rerun", teacher={"down_families": ["file_search"], "down_samples": [0, 1]},
                        **{"gate.max_infra_share": 0.5})
    (tmp_path / "down").touch()  # every episode of file_search ends teacher_error: 2 of 4, allowed here
    rec = run_build(parse_config(cfg))
    assert rec["status"] == "committed"
    store = RunStore(cfg["runs"], "rerun")

    def labels(record) -> dict[str, str]:
        m = Manifest.model_validate(store.read_json(posixpath.join(record["stages"]["calibrate"]["manifest"],
                                                                   "manifest.json")))
        return {c.env_id.split("-")[0]: c.label for c in store.read_records(m.parts, Calibration)}

    assert labels(rec) == {"log_report": "trivial", "file_search": "unlabelled"}
    first_pass = len(_sessions(tmp_path))
    (tmp_path / "down").unlink()
    assert run_build(parse_config(cfg))["stages"]["rollout"]["status"] == "reused", "committed: reused as is"
    assert len(_sessions(tmp_path)) == first_pass
    rec2 = rerun_build(parse_config(cfg), "rollout")  # = `trajforge rerun rollout`
    assert len(_sessions(tmp_path)) - first_pass == 2, "only the two teacher_error episodes ran again"
    assert rec2["build_id"] != rec["build_id"], "a rerun goes into a new build"
    old = store.read_build(rec["build_id"])
    assert old.status == "committed" and store.latest() == rec2["build_id"]
    assert store.exists(posixpath.join(rec["stages"]["rollout"]["manifest"], "manifest.json")), \
        "the build that committed the output is left as it was"
    assert labels(rec) == {"log_report": "trivial", "file_search": "unlabelled"}
    assert rec2["stages"]["verify"]["status"] == "committed", "the stages after it run again"
    assert labels(rec2) == {"log_report": "trivial", "file_search": "trivial"}
    m = store.read_json(posixpath.join(rec2["stages"]["rollout"]["manifest"], "manifest.json"))
    assert m["revision"] == 1 and m["stats"]["infra"] == 0
