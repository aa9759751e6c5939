"""A build with two teachers (a demonstrator beside a weak one), through the real flow: every teacher
runs its own number of episodes, calibration is per teacher, `sft` holds only verified successes and
`preference` pairs the demonstrator's success with the weak teacher's failure of the same environment."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from trajforge.flows.cli import run_build
from trajforge.schemas.config import parse_config
from trajforge.tasks.families import get_family

from helpers import small_config

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
