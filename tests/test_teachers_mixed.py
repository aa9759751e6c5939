"""A build with two teachers (a demonstrator beside a weak one), through the real flow: every teacher
runs its own number of episodes, calibration is per teacher, `sft` holds only verified successes and
`preference` pairs the demonstrator's success with the weak teacher's failure of the same environment."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from helpers import small_config

from trajforge.flows.launch import run_build
from trajforge.schemas.config import parse_config
from trajforge.tasks.envs.families import get_family

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("prefect_api")]


def test_demonstrator_and_weak_teacher_in_one_build(tmp_path):
    import datasets

    envs = [get_family(n).generate(1, 0) for n in ("log_report", "file_search")]
    idle = tmp_path / "idle.jsonl"  # a teacher that looks around and submits nothing useful
    idle.write_text("".join(json.dumps({"env_id": e.env_id, "sample": k, "commands": ["ls"]}) + "\n"
                            for e in envs for k in range(2)))
    cfg = small_config(tmp_path / "runs", dataset="mixed", **{
        "teacher": {"backend": "replay", "name": "idle", "replay": {"source": str(idle)}},
        "extra_teachers": [{"backend": "replay", "name": "reference", "samples_per_env": 1}],
        "rollout.samples_per_env": 2, "rollout.episodes_per_shard": 3})
    rec = run_build(parse_config(cfg))
    assert rec["status"] == "committed"
    ds = Path(cfg["runs"]) / "mixed" / "latest" / "dataset"
    traj = datasets.load_dataset(str(ds), "trajectories")["train"]
    assert Counter(traj["teacher"]) == {"idle": 4, "reference": 2}
    assert {(t, p) for t, p in zip(traj["teacher"], traj["passed"])} == {("idle", False), ("reference", True)}
    assert set(traj["difficulty"]) == {"unsolved", "trivial"}  # per (environment, teacher)
    sft = datasets.load_dataset(str(ds), "sft")["train"]
    assert sft.num_rows == 2 and set(sft["teacher"]) == {"reference"}
    pref = datasets.load_dataset(str(ds), "preference")["train"]
    assert pref.num_rows == 2 and all(c > r for c, r in zip(pref["chosen_reward"], pref["rejected_reward"]))
    card = (ds / "README.md").read_text()
    assert "`idle`" in card and "`reference`" in card


def test_adaptive_round_extends_only_the_unsure_teachers(tmp_path):
    """The rollout plan of an adaptive round: the extra samples calibration asked for, for exactly the
    (environment, teacher) pairs it was unsure of; round 0 gives each teacher its own sample count."""
    from trajforge.schemas.calibration import RoundPlan
    from trajforge.tasks.engine import Manifest, StageContext
    from trajforge.tasks.rollout import RolloutStage

    cfg = parse_config(small_config(tmp_path / "runs", dataset="plan", **{
        "teacher": {"backend": "replay", "name": "model"},
        "extra_teachers": [{"backend": "replay", "name": "reference", "samples_per_env": 1}],
        "rollout.episodes_per_shard": 100}))
    calib = Manifest(stage="calibrate", fingerprint="x", build_id="b", dir="d", parts=[], rows=0, rejects=0,
                     reject_reasons={}, components={}, gate={}, created_at="",
                     stats={"round_plan": RoundPlan(needs_more={"e1": 2, "e2": 1}, next_sample={"e1": 4, "e2": 6},
                                                    unsure_teachers={"e1": ["model"], "e2": ["model", "reference"]}
                                                    ).model_dump()})
    shards = RolloutStage().plan(StageContext.create(cfg, "b"), {"calibrate": calib})
    work = [tuple(w) for s in shards for w in s.payload["episodes"]]
    assert sorted(work) == [("e1", 4, 0), ("e1", 5, 0), ("e2", 6, 0), ("e2", 6, 1)]
