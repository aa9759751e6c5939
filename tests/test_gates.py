"""Gates that catch a bad build (issue 16): per stage, a planted bad output whose gate fails naming the
right expectation (with observed value, threshold and offending rows) beside the matching healthy
output that passes; thresholds from the config (`gates:`), recorded in gate.json; a changed threshold
re-runs only the gate; `--accept-gate` commits a failure on purpose, recorded in build.json and the
card. Most run the real gate (Great Expectations) on planted Parquet; one is a real `trajforge build`.
"""

from __future__ import annotations

import json
import posixpath
from pathlib import Path

import pytest
import yaml
from helpers import run_cli, small_config

from trajforge.expectations.figures import GateFacts
from trajforge.expectations.gate import check_gates, effective_suite, gate_columns, run_gate
from trajforge.schemas.arrow import arrow_schema, to_table
from trajforge.schemas.calibration import Calibration
from trajforge.schemas.common import FileSpec, Reject
from trajforge.schemas.config import ConfigError, parse_config
from trajforge.schemas.environment import EnvSpec
from trajforge.schemas.export import PreferenceRow, TrajectoryRow
from trajforge.schemas.trajectory import Message, Rollout
from trajforge.schemas.verdict import Verdict
from trajforge.tasks.engine import GateFailed, Shard, StageContext, StagePlan, commit, prepare
from trajforge.tasks.export import content_hashes, preference
from trajforge.tasks.synthesize import SynthesizeStage


def _cfg(tmp_path: Path, **over):
    return parse_config(small_config(tmp_path / "runs", **over))


def _gate(stage: str, model, rows, cfg, stats=None, rejects=None):
    """The gate of `stage` as a commit runs it: effective suite from `cfg`, only the gate's columns."""
    suite = effective_suite(stage, cfg.gates.get(stage), cfg.gate.extra.get(stage, []), GateFacts.of(cfg))
    table = to_table(model, rows)
    table = table.select(gate_columns(stage, arrow_schema(model), suite=suite))
    reasons: dict[str, int] = {}
    for r in rejects or []:
        reasons[r.reason] = reasons.get(r.reason, 0) + 1
    stats = {"rows": len(rows), "rejects": len(rejects or []), "reject_reasons": reasons, **(stats or {})}
    return run_gate(stage, table, stats, suite=suite, rejects=to_table(Reject, rejects or []))


def _failed(report) -> dict[str, dict]:
    return {f["name"]: f for f in report["failures"]}


# -- synthesize ---------------------------------------------------------------------------------------

def _env(i: int, family: str) -> EnvSpec:
    return EnvSpec(env_id=f"{family}-{i}", family=family, level=1, seed=i, instruction=f"do task number {i} well",
                   tests=[FileSpec(path="test_x.py", content="def test_a(): pass")], solution=["true"],
                   image=f"trajforge/env:{i:016x}")


def test_synthesize_one_family_set_fails_family_share_and_the_spread_set_passes(tmp_path):
    cfg = _cfg(tmp_path)  # asks for log_report and file_search
    one = _gate("synthesize", EnvSpec, [_env(i, "log_report") for i in range(6)], cfg,
                {"yield": {"procedural|kept": 6, "procedural|solution_failed": 6}})
    f = _failed(one)["synthesize.family_share"]
    assert f["observed"] == ["1.0"] and f["threshold"] == {"max_value": 0.8}
    assert f["rows"] == ["log_report-0", "log_report-1", "log_report-2", "log_report-3", "log_report-4"]
    assert list(_failed(one)) == ["synthesize.family_share"]
    good = _gate("synthesize", EnvSpec, [_env(i, f) for i in range(3) for f in ("log_report", "file_search")], cfg,
                 {"yield": {"procedural|kept": 6}})
    assert good["success"], good["failures"]
    # one family asked for is a choice, not a bad build
    single = _cfg(tmp_path, **{"synthesize.families": [{"name": "log_report", "levels": [1], "seeds": [0]}]})
    assert _gate("synthesize", EnvSpec, [_env(i, "log_report") for i in range(6)], single)["success"]


def test_synthesize_low_yield_and_near_duplicates_fail_their_stats_expectations(tmp_path):
    cfg = _cfg(tmp_path)
    envs = [_env(0, "log_report"), _env(1, "file_search")]
    dups = [Reject(key=f"dup{i}", reason="near_duplicate", detail="nearly the same as x") for i in range(8)]
    bad = _gate("synthesize", EnvSpec, envs, cfg, {"yield": {"procedural|kept": 2, "harbor|kept": 0,
                                                             "harbor|solution_failed": 9, "procedural|near_duplicate": 8}},
                rejects=dups)
    failed = _failed(bad)
    assert failed["synthesize.yield_per_source"]["observed"] == {"harbor": 0.0}
    share = failed["synthesize.near_duplicate_share"]
    assert share["observed"] == pytest.approx(0.8) and share["rows"] == [f"dup{i}" for i in range(5)]


# -- rollout ------------------------------------------------------------------------------------------

def _rollout(i: int, teacher: str, status: str, turns: int = 2) -> Rollout:
    return Rollout(rollout_id=f"{teacher}-{i}", env_id=f"e{i % 4}", teacher=teacher, harness="h", sample=i,
                   messages=[Message(role="user", content="hi")], status=status, turns=turns)


def test_rollout_teacher_answering_nothing_fails_format_error_share_and_a_weak_one_passes(tmp_path):
    cfg = _cfg(tmp_path, **{"rollout.max_turns": 6})
    # the demo's SmolLM2: most episodes are format errors, some are not
    weak = [_rollout(i, "smol", "format_error" if i % 4 else "max_turns") for i in range(24)]
    ref = [_rollout(i, "reference", "ok") for i in range(6)]
    assert _gate("rollout", Rollout, weak + ref, cfg)["success"]
    # a teacher returning empty answers: every episode ends as format_error
    empty = [_rollout(i, "empty", "format_error", turns=3) for i in range(8)]
    f = _failed(_gate("rollout", Rollout, empty + ref, cfg))["rollout.format_error_share"]
    assert f["observed"] == ["1.0"] and f["threshold"] == {"max_value": 0.98}
    assert f["rows"] == [f"empty-{i}" for i in range(5)] and f["unexpected_count"] == 8


def test_rollout_turns_beyond_the_limit_and_empty_episodes_fail(tmp_path):
    cfg = _cfg(tmp_path, **{"rollout.max_turns": 4})
    over = [_rollout(i, "t", "ok", turns=9 if i == 3 else 2) for i in range(6)]
    f = _failed(_gate("rollout", Rollout, over, cfg))["rollout.turns_within_limit"]
    assert f["threshold"] == {"max_value": 4} and f["rows"] == ["t-3"]
    # a teacher too slow for the episode budget: agent_timeout before any answer
    slow = [_rollout(i, "t", "agent_timeout", turns=0 if i < 5 else 1) for i in range(6)]
    f = _failed(_gate("rollout", Rollout, slow, cfg))["rollout.episodes_with_turns"]
    assert f["observed"] == pytest.approx(1 / 6, abs=1e-4) and f["threshold"]["mostly"] == 0.5


# -- verify -------------------------------------------------------------------------------------------

def _verdict(i: int, tests_passed: bool, flagged: bool) -> Verdict:
    return Verdict(rollout_id=f"r{i}", env_id=f"e{i % 3}", teacher="t", sample=i, status="ok", verified=True,
                   reward=1.0 if tests_passed else 0.0, tests_passed=tests_passed, passed=tests_passed and not flagged,
                   hack_flags=["review_outlier"] if flagged else [])


def test_verify_a_verifier_flagging_everything_fails_hack_flag_rate(tmp_path):
    cfg = _cfg(tmp_path)
    healthy = [_verdict(i, tests_passed=i % 2 == 0, flagged=i == 2) for i in range(12)]
    assert _gate("verify", Verdict, healthy, cfg)["success"]
    flags_all = [_verdict(i, tests_passed=i % 2 == 0, flagged=i % 2 == 0) for i in range(12)]
    f = _failed(_gate("verify", Verdict, flags_all, cfg))["verify.hack_flag_rate"]
    assert f["observed"] == 0.0 and f["threshold"]["mostly"] == 0.5 and f["rows"] == ["r0", "r2", "r4", "r6", "r8"]


def test_verify_a_verifier_that_cannot_judge_fails_verifier_error_share(tmp_path):
    cfg = _cfg(tmp_path)
    rows = [_verdict(i, True, False) for i in range(4)]
    errors = [Reject(key=f"x{i}", reason="verifier_error", detail="no parseable result") for i in range(4)]
    f = _failed(_gate("verify", Verdict, rows, cfg, rejects=errors))
    assert f["verify.verifier_error_share"]["observed"] == 0.5 and f["verify.verifier_error_share"]["rows"][0] == "x0"


# -- calibrate ----------------------------------------------------------------------------------------

def _calib(i: int, attempts: int, passes: int, label: str, rate: float | None = None) -> Calibration:
    p = passes / attempts if attempts else 0.0
    return Calibration(env_id=f"e{i}", family="f", level=1, teacher="t", attempts=attempts, passes=passes,
                       excluded=0 if attempts else 2, solve_rate=p if rate is None else rate, ci_low=0.0,
                       ci_high=1.0, label=label, certain=False)


def test_calibrate_planted_labels_fail_labelled_unlabelled_share_and_consistency(tmp_path):
    cfg = _cfg(tmp_path)
    healthy = [_calib(0, 4, 4, "trivial"), _calib(1, 4, 0, "unsolved"), _calib(2, 4, 2, "medium"),
               _calib(3, 0, 0, "unlabelled")]
    assert _gate("calibrate", Calibration, healthy, cfg)["success"]
    unlabelled = [_calib(i, 0, 0, "unlabelled") for i in range(3)] + [_calib(3, 4, 1, "hard")]
    assert "calibrate.unlabelled_share" in _failed(_gate("calibrate", Calibration, unlabelled, cfg))
    wrong = [_calib(0, 4, 4, "unlabelled"), _calib(1, 4, 0, "unsolved", rate=0.75), _calib(2, 4, 2, "medium")]
    failed = _failed(_gate("calibrate", Calibration, wrong, cfg))
    assert failed["calibrate.labelled"]["rows"] == ["e0"]
    assert failed["calibrate.solve_rate_consistent"]["rows"] == ["e1"]


def test_calibrate_label_variety_is_off_unless_the_config_enables_it(tmp_path):
    same = [_calib(i, 2, 2, "trivial") for i in range(4)]  # a replay teacher: every pair trivial
    report = _gate("calibrate", Calibration, same, _cfg(tmp_path))
    assert report["success"] and "label_variety" in report["disabled"]
    strict = _cfg(tmp_path, gates={"calibrate": {"label_variety": True}})
    f = _failed(_gate("calibrate", Calibration, same, strict))["calibrate.label_variety"]
    assert f["observed"] == 1 and f["threshold"] == {"min_value": 2}


# -- export -------------------------------------------------------------------------------------------

def _traj(i: int, env: str, passed: bool, msgs: list[Message], status: str = "ok") -> TrajectoryRow:
    return TrajectoryRow(rollout_id=f"r{i}", env_id=env, family="f", level=1, teacher="t", harness="h", sample=i,
                         messages=msgs, tools_json="[]", status=status, passed=passed, reward=float(passed),
                         tests_passed=int(passed), tests_total=1, hack_flags=[], step_labels=[],
                         inspect_before_act=False, act_verify_share=0.0, ends_with_verify=False,
                         repeated_commands=0, failed_commands=0, recoveries=0,
                         turns=sum(m.role == "assistant" for m in msgs), prompt_tokens=1, completion_tokens=1,
                         wall_s=0.1, difficulty="medium", solve_rate=0.5)


def _msgs(env: str, answer: str | None) -> list[Message]:
    return [Message(role="system", content="sys"), Message(role="user", content=f"task {env}"),
            *([Message(role="assistant", content=answer)] if answer is not None else [])]


def _with_hashes(rows: list[TrajectoryRow]) -> list[TrajectoryRow]:
    hashes = content_hashes(to_table(TrajectoryRow, rows).column("messages")).to_pylist()
    return [r.model_copy(update={"content_hash": h}) for r, h in zip(rows, hashes)]


def test_export_duplicated_trajectories_fail_trajectory_copies(tmp_path):
    cfg = _cfg(tmp_path)  # 2 samples per environment, one teacher: at most 2 copies of one trajectory
    healthy = _with_hashes([_traj(i, f"e{i // 2}", True, _msgs(f"e{i // 2}", "```bash\nls\n```")) for i in range(8)])
    assert len({r.content_hash for r in healthy}) == 4  # the two samples of a deterministic teacher agree
    assert _gate("export", TrajectoryRow, healthy, cfg)["success"]
    # one trajectory written again and again (a duplicating bug): more copies than its environment had episodes
    repeated = _with_hashes([_traj(i, "e0", True, _msgs("e0", "```bash\nls\n```")) for i in range(8)])
    f = _failed(_gate("export", TrajectoryRow, repeated, cfg))["export.trajectory_copies"]
    assert f["observed"] == ["8.0"] and f["threshold"] == {"max_value": 2} and len(f["rows"]) == 5
    sft = _failed(_gate("export.sft", TrajectoryRow, repeated, cfg))
    assert "export.sft.trajectory_copies" in sft
    # environments whose prompts agree (an instruction that does not vary by seed) may share trajectories
    same_prompt = _with_hashes([_traj(i, f"e{i // 2}", True, _msgs("e0", "```bash\nls\n```")) for i in range(8)])
    assert _gate("export", TrajectoryRow, same_prompt, cfg)["success"]


def test_export_never_pairs_a_side_without_model_turns_and_the_gate_catches_one(tmp_path):
    cfg = _cfg(tmp_path)
    ctx = StageContext.create(cfg, "b")
    rows = [_traj(0, "e0", True, _msgs("e0", "```bash\nls\n```")),
            _traj(1, "e0", False, _msgs("e0", None), status="agent_timeout"),  # 0 turns
            _traj(2, "e0", False, _msgs("e0", "```bash\npwd\n```"), status="max_turns")]
    pairs = preference(ctx, to_table(TrajectoryRow, rows), {}).to_pylist()
    assert [(p["chosen_id"], p["rejected_id"]) for p in pairs] == [("r0", "r2")]
    assert pairs[0]["chosen_turns"] == 1 and pairs[0]["rejected_turns"] == 1
    empty = PreferenceRow(env_id="e0", family="f", level=1, prompt=[], chosen=_msgs("e0", "x")[2:], rejected=[],
                          chosen_id="r0", rejected_id="r1", chosen_reward=1.0, rejected_reward=0.0, tools_json="[]",
                          chosen_turns=1, rejected_turns=0)
    f = _failed(_gate("export.preference", PreferenceRow, [empty], cfg))
    assert list(f) == ["export.preference.rejected_turns"] and f["export.preference.rejected_turns"]["rows"] == ["r0"]


def test_gates_config_names_real_suites_and_expectations_and_a_reason_to_disable(tmp_path):
    check_gates(_cfg(tmp_path, gates={"export.sft": {"model_turns": 2}}).gates)
    with pytest.raises(ValueError, match="gates: no suite 'rollot'"):
        check_gates(_cfg(tmp_path, gates={"rollot": {"format_error_share": 0.5}}).gates)
    with pytest.raises(ValueError, match="gates.rollout: no expectation named format_error_shar "):
        check_gates(_cfg(tmp_path, gates={"rollout": {"format_error_shar": 0.5}}).gates)
    with pytest.raises(ConfigError, match="gates.verify.hack_flag_rate: .*needs a `reason`"):
        _cfg(tmp_path, gates={"verify": {"hack_flag_rate": {"enabled": False}}})


# -- config overrides, re-gating, accepting: through the engine's commit on real Parquet --------------

def _synth_ctx(tmp_path: Path, build_id: str = "b1", **over) -> StageContext:
    from trajforge.schemas.build import BuildRecord

    ctx = StageContext.create(_cfg(tmp_path, **over), build_id)
    ctx.store.write_build(BuildRecord(build_id=build_id, dataset=ctx.config.dataset, created_at=""))
    return ctx


def _plant_synth(ctx: StageContext, fp: str, envs: list[EnvSpec]) -> StagePlan:
    plan_dir = ctx.store.stage_dir(ctx.build_id, "synthesize", fp)
    shard = Shard(index=0)
    ctx.store.write_records(posixpath.join(plan_dir, "part-00000.parquet"), EnvSpec, envs)
    ctx.store.write_json(posixpath.join(plan_dir, "_done", shard.name),
                         {"shard": shard.name, "part": "part-00000.parquet", "rows": len(envs), "rejects": 0,
                          "stats": {"yield": {"procedural|kept": len(envs)}}, "seconds": 0.1})
    return StagePlan("synthesize", fp, {"gate": "x"}, plan_dir, None, [shard], [])


def test_a_config_override_lets_an_unusual_build_through_and_gate_json_records_it(tmp_path):
    lopsided = [_env(i, "log_report") for i in range(9)] + [_env(0, "file_search")]
    ctx = _synth_ctx(tmp_path)
    with pytest.raises(GateFailed, match=r"synthesize\.family_share .*observed \['0\.9'\], threshold max_value=0\.8"):
        commit(SynthesizeStage(), ctx, _plant_synth(ctx, "fp1", lopsided))
    ctx = _synth_ctx(tmp_path, gates={"synthesize": {
        "family_share": {"max_value": 0.95},
        "yield_per_source": {"enabled": False, "reason": "imports are validated elsewhere"}}})
    manifest = commit(SynthesizeStage(), ctx, _plant_synth(ctx, "fp2", lopsided))
    gate = ctx.store.read_json(posixpath.join(manifest.dir, "gate.json"))
    assert gate["success"] and gate["overridden"]["family_share"] == {"max_value": 0.95}
    assert gate["disabled"] == {"yield_per_source": "imports are validated elsewhere"}
    assert manifest.gate["disabled"] == gate["disabled"] and manifest.gate["overridden"] == gate["overridden"]


def test_a_tightened_threshold_reruns_only_the_gate_and_accept_commits_it_on_purpose(tmp_path):
    from helpers import run_stage
    from test_infra_outcomes import FakeRollout

    from trajforge.tasks.engine.runner import fingerprint_components

    ctx = _synth_ctx(tmp_path, "b1", **{"rollout.samples_per_env": 2, "rollout.episodes_per_shard": 2})
    envs = [_env(i, "log_report") for i in range(2)]
    part = posixpath.join(ctx.store.root, "upstream", "envs.parquet")
    ctx.store.write_records(part, EnvSpec, envs)
    from test_infra_outcomes import _manifest
    upstream = {"synthesize": _manifest("synthesize", [part])}
    stage = FakeRollout()
    _, first = run_stage(stage, ctx, upstream)
    runs = stage.runs
    # the same config: reused as it is
    assert prepare(stage, ctx, upstream).reused is not None
    # a tighter threshold: same fingerprint (folder, downstream hashes), only the gate runs again
    tight = _synth_ctx(tmp_path, "b2", **{"rollout.samples_per_env": 2, "rollout.episodes_per_shard": 2,
                                          "gates": {"rollout": {"turns_within_limit": 0}}})
    plan = prepare(stage, tight, upstream)
    assert plan.fingerprint == first.fingerprint and plan.reused is None and plan.regate and not plan.pending
    assert fingerprint_components(stage, tight, {})["gate"] != first.gate["suite"]
    with pytest.raises(GateFailed) as err:
        commit(stage, tight, plan, upstream)
    msg = str(err.value)
    assert "rollout.turns_within_limit" in msg and "threshold max_value=0" in msg and "--accept-gate" in msg
    assert stage.runs == runs, "no shard ran again"
    assert tight.store.exists(posixpath.join(plan.dir, "part-00000.parquet")), "the output stays for inspection"
    assert not tight.store.exists(posixpath.join(plan.dir, "manifest.json"))
    tight.runtime["accept_gates"] = ["rollout.turns_within_limit"]
    manifest = commit(stage, tight, plan, upstream)
    assert manifest.content_id == first.content_id and manifest.rows == first.rows and stage.runs == runs
    assert [a["name"] for a in manifest.gate["accepted"]] == ["rollout.turns_within_limit"]
    assert manifest.gate["regated"] is True
    gate = tight.store.read_json(posixpath.join(plan.dir, "gate.json"))
    assert gate["success"] and gate["accepted"][0]["name"] == "rollout.turns_within_limit"


# -- the CLI: a real build whose teacher answers nothing --------------------------------------------

@pytest.mark.docker
@pytest.mark.slow
def test_cli_names_the_failed_expectation_and_accept_gate_commits_it_recorded(tmp_path, prefect_api_url):
    from fake_openai import FakeOpenAI

    with FakeOpenAI("ok", lambda req, n: {"role": "assistant", "content": ""}) as srv:
        cfg = small_config(tmp_path / "runs", dataset="empty", **{
            "teacher": {"backend": "openai", "endpoints": [srv.url], "model": "fake", "tool_calling": False,
                        "retries": 0},
            "rollout.max_turns": 3, "rollout.episodes_per_shard": 4})
        path = tmp_path / "empty.yaml"
        path.write_text(yaml.safe_dump(cfg))
        out = run_cli("build", str(path), cwd=tmp_path, prefect_api=prefect_api_url)
        assert out.returncode == 1, out.stdout + out.stderr
        err = " ".join(out.stderr.split())
        assert "gate of stage 'rollout' failed" in err
        assert "rollout.format_error_share" in err and "observed ['1.0']" in err and "max_value=0.98" in err
        assert "rows: " in err and "--accept-gate rollout.format_error_share" in err
        runs = tmp_path / "runs" / "empty"
        (build_dir,) = [p for p in runs.iterdir() if p.is_dir() and p.name != "latest"]
        rec = json.loads((build_dir / "build.json").read_text())
        assert rec["status"] == "failed" and rec["stages"]["rollout"]["status"] == "failed"
        failure = rec["stages"]["rollout"]["gate"]["failures"][0]
        assert failure["name"] == "rollout.format_error_share" and len(failure["rows"]) == 4
        rollout_dir = build_dir / "rollout" / rec["stages"]["rollout"]["fingerprint"]
        assert list(rollout_dir.glob("part-*.parquet")) and not (rollout_dir / "manifest.json").exists()
        explained = run_cli("explain", "--runs", str(tmp_path / "runs"), "--dataset", "empty", build_dir.name,
                            cwd=tmp_path)
        assert "gate FAILED: rollout.format_error_share" in explained.stdout, explained.stdout + explained.stderr

        requests = srv.requests
        out = run_cli("build", str(path), "--accept-gate", "rollout.format_error_share", cwd=tmp_path,
                      prefect_api=prefect_api_url)
        assert out.returncode == 0, out.stdout + out.stderr
        assert srv.requests == requests, "the rollouts were kept: only the gate ran again"
    rec = json.loads((build_dir / "build.json").read_text())
    assert rec["status"] == "committed" and rec["accept_gates"] == ["rollout.format_error_share"]
    assert rec["stages"]["rollout"]["gate"]["accepted"][0]["name"] == "rollout.format_error_share"
    card = (build_dir / "dataset" / "README.md").read_text()
    assert "## Gates" in card and "**accepted** `rollout.format_error_share`" in card
    explained = run_cli("explain", "--runs", str(tmp_path / "runs"), "--dataset", "empty", cwd=tmp_path)
    assert "gate accepted on purpose: rollout.format_error_share" in explained.stdout
    unknown = run_cli("build", str(path), "--accept-gate", "no_such_gate", cwd=tmp_path)
    assert unknown.returncode == 2 and "no such gate expectation" in unknown.stderr
