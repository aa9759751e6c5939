"""A re-run stage carries its new output downstream (issue 45), through the real flow (Docker, Prefect,
Dask): with a teacher whose episodes differ from run to run, `build --force rollout` re-runs verify,
calibrate and export and the new dataset holds exactly the new rollouts; `trajforge stage rollout --build
ID` does the same inside the build; an `--only` re-run leaves what it did not run `stale`, never shown as
committed; `rerun` with nothing to re-run changes nothing; with the replay teacher a forced rollout that
writes the same rows lets every stage after it be reused."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from helpers import run_cli, small_config

from trajforge.flows.explain import explain_build
from trajforge.flows.launch import rerun_build, run_build
from trajforge.schemas.config import parse_config
from trajforge.schemas.trajectory import Rollout
from trajforge.tasks.engine import RunStore

pytestmark = [pytest.mark.docker, pytest.mark.slow]
TESTS = str(Path(__file__).resolve().parent)
DOWNSTREAM = ("verify", "calibrate", "export")


@pytest.fixture
def sampling(tmp_path, monkeypatch, prefect_api):
    """A config whose teacher samples (tests/sampling_teacher.py), and its first committed build."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))  # Dask workers
    cfg = parse_config(small_config(tmp_path / "runs", dataset="sampled", plugins=["sampling_teacher"],
                                    teacher={"backend": "sampling"}, **{
                                        "synthesize.families": [{"name": "log_report", "levels": [1], "seeds": [0]}]}))
    first = run_build(cfg)
    assert first["status"] == "committed"
    return cfg, first


def _words(store: RunStore, record: dict) -> set[str]:
    """The words the sampling teacher echoed in the rollouts `record`'s rollout stage holds."""
    parts = store.read_json(f"{record['stages']['rollout']['manifest']}/manifest.json")["parts"]
    return {s.command.split()[1] for r in store.read_records(parts, Rollout) for s in r.steps}


def _dataset_words(store: RunStore, record: dict) -> set[str]:
    """The words in the `trajectories` config of `record`'s dataset (its export)."""
    table = pq.read_table(Path(record["stages"]["export"]["manifest"]) / "trajectories")
    return {c["function"]["arguments"].split("echo ")[1].rstrip('"}') for msgs in table.column("messages").to_pylist()
            for m in msgs for c in (m.get("tool_calls") or []) if "echo " in c["function"]["arguments"]}


def test_a_forced_rollout_reruns_what_reads_it_and_the_dataset_holds_the_new_rollouts(sampling):
    cfg, first = sampling
    store = RunStore(cfg.runs, cfg.dataset)
    second = run_build(cfg, force=["rollout"])
    st = {n: s["status"] for n, s in second["stages"].items()}
    # verify and export read the rollouts: they run again. The echoed words fail the task's tests both times,
    # so verify writes the same verdicts and calibrate, which reads only those, is reused.
    assert st == {"propose": "reused", "synthesize": "reused", "rollout": "committed", "verify": "committed",
                  "calibrate": "reused", "export": "committed"}, st
    assert second["stages"]["rollout"]["fingerprint"] == first["stages"]["rollout"]["fingerprint"]
    assert all(second["stages"][n]["fingerprint"] != first["stages"][n]["fingerprint"] for n in ("verify", "export"))
    new, old = _words(store, second), _words(store, first)
    assert len(new) == 2 and not new & old, "the episodes really ran again, with other words"
    assert _dataset_words(store, second) == new, "the new dataset holds exactly the new rollouts"
    assert _dataset_words(store, first) == old, "the first build's dataset is left as it was"
    text = "\n".join(explain_build(store, second["build_id"]))
    assert "forced with --force rollout; it wrote other rows" in text
    assert "upstream output changed: rollout (digest" in text

    again = rerun_build(cfg, "rollout")  # nothing to re-run: the same rows, everything reused
    assert {s["status"] for s in again["stages"].values()} == {"reused"}
    assert again["stages"]["export"]["manifest"] == second["stages"]["export"]["manifest"]


def test_stage_rollout_in_a_build_brings_the_stages_after_it_up_to_date(sampling, prefect_api_url, tmp_path):
    cfg, first = sampling
    store = RunStore(cfg.runs, cfg.dataset)
    build, old = first["build_id"], _words(store, first)  # (the forced re-run rewrites the same folder)
    env = {"PYTHONPATH": os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")])}
    r = run_cli("stage", "rollout", "--build", build, "--runs", cfg.runs, cwd=tmp_path, env=env,
                prefect_api=prefect_api_url)
    assert r.returncode == 0, r.stderr[-3000:]
    rec = store.read_build(build).model_dump(mode="json")
    assert rec["status"] == "committed"
    assert {n: rec["stages"][n]["status"] for n in ("rollout", "verify", "calibrate", "export")} == {
        "rollout": "committed", "verify": "committed", "calibrate": "reused", "export": "committed"}
    new = _words(store, rec)
    assert new and not new & old
    assert _dataset_words(store, rec) == new
    assert os.path.realpath(Path(cfg.runs) / cfg.dataset / "latest" / "dataset") == os.path.realpath(
        rec["stages"]["export"]["manifest"])
    lines = explain_build(store, build)
    export = next(line for line in lines if line.startswith("- export"))
    assert "upstream output changed: rollout (digest" in export and "no committed output" not in export, export

    # re-running rollout alone (--only) leaves what reads it stale: never shown as committed
    only = run_build(cfg, build_id=build, only=["rollout"], force=["rollout"])
    assert only["status"] == "partial"
    assert {n: only["stages"][n]["status"] for n in ("verify", "export")} == {"verify": "stale", "export": "stale"}
    assert only["stages"]["calibrate"]["status"] == "stale", "it reads verify, which is stale"
    text = "\n".join(explain_build(store, build))
    assert "- verify" in text and "STALE" in text and "--from verify" in text


def test_a_forced_replay_rollout_with_the_same_rows_reuses_what_reads_it(tmp_path, prefect_api):
    cfg = parse_config(small_config(tmp_path / "runs", dataset="replayed", **{
        "synthesize.families": [{"name": "log_report", "levels": [1], "seeds": [0]}]}))
    first = run_build(cfg)
    second = run_build(cfg, force=["rollout"])
    assert second["stages"]["rollout"]["status"] == "committed"
    assert {n: second["stages"][n]["status"] for n in DOWNSTREAM} == {n: "reused" for n in DOWNSTREAM}
    assert second["stages"]["export"]["fingerprint"] == first["stages"]["export"]["fingerprint"]
    text = "\n".join(explain_build(RunStore(cfg.runs, cfg.dataset), second["build_id"]))
    assert "it wrote the same rows as build" in text
