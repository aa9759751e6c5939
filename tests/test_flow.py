"""The whole build as users run it: a real Prefect flow on real Dask clusters, real containers,
real Parquet read back with `datasets`."""

from __future__ import annotations

import json
import os
import posixpath
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from helpers import run_cli, small_config, venv_bin

from trajforge.flows.explain import explain_build
from trajforge.flows.launch import run_build
from trajforge.schemas.config import parse_config
from trajforge.tasks.engine import GateFailed
from trajforge.tasks.engine.store import RunStore

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]


@pytest.fixture(scope="module")
def built(tmp_path_factory, prefect_api):
    """One full build on a LocalCluster of worker processes (the default), shared by the reuse / re-run tests."""
    runs = tmp_path_factory.mktemp("runs")
    # every validation (and its audit, whose cost `status` shows) runs in this build: none read back from another's
    cfg = parse_config(small_config(runs, **{"dask.processes": True, "synthesize.reuse_validations": False}))
    record = run_build(cfg)
    return cfg, record


def _markers(store: RunStore, stage_dir: str) -> list[dict]:
    return [json.loads(store.fs.cat(p)) for p in sorted(store.fs.glob(posixpath.join(stage_dir, "_done", "*")))]


def test_full_build_commits_every_stage_and_loads_with_datasets(built):
    import datasets

    cfg, record = built
    assert record["status"] == "committed"
    assert [record["stages"][s]["status"] for s in record["stages"]] == ["committed"] * 6
    store = RunStore(cfg.runs, cfg.dataset)
    rollout_dir = record["stages"]["rollout"]["manifest"]
    workers = {m["worker"] for m in _markers(store, rollout_dir)}
    assert workers and all(not w.endswith(f":{os.getpid()}") for w in workers), "shards ran in Dask workers"
    rollouts = pq.read_table(posixpath.join(rollout_dir, "part-00000.parquet")).to_pylist()
    assert {r["status"] for r in rollouts} == {"ok"}
    assert any(m["tool_calls"] for m in rollouts[0]["messages"]) and rollouts[0]["steps"][0]["exit_code"] == 0
    ds = datasets.load_dataset(str(Path(cfg.runs) / cfg.dataset / "latest" / "dataset"), "sft")["train"]
    assert ds.num_rows == 4  # 2 environments x 2 samples, the replayed reference solution always passes
    assert len(set(ds["rollout_id"])) == 4 and set(ds["difficulty"]) == {"trivial"}
    assert ds[0]["messages"][0]["role"] == "system" and ds[0]["messages"][2]["tool_calls"][0]["function"]["name"] == "bash"
    call = ds[0]["messages"][2]["tool_calls"][0]["function"]
    assert isinstance(call["arguments"], dict) and call["arguments"]["command"]  # a JSON object (issue 31)
    assert [t["function"]["name"] for t in ds[0]["tools"]] == ["bash", "submit"] and set(ds["malformed_tool_calls"]) == {0}
    allrows = datasets.load_dataset(str(Path(cfg.runs) / cfg.dataset / "latest" / "dataset"), "trajectories")["train"]
    assert sorted(allrows["rollout_id"]) == sorted(ds["rollout_id"]) and set(allrows["reward"]) == {1.0}
    assert set(allrows["test_strength"]) == {1.0}  # each environment's tests killed every mutant of the audit
    for stage in record["stages"].values():
        d = stage["manifest"]
        for f in ("manifest.json", "stats.json", "gate.json", "rejects.parquet"):
            assert os.path.exists(os.path.join(d, f)), (d, f)


def test_status_shows_the_test_audit_cost(built, tmp_path):
    cfg, record = built
    stats = RunStore(cfg.runs, cfg.dataset).read_json(posixpath.join(record["stages"]["synthesize"]["manifest"],
                                                                     "stats.json"))
    assert stats["audit"]["envs"] == 2 and stats["audit"]["test_runs"] >= 2 and stats["audit"]["weak"] == 0
    assert stats["test_strength"] == {"1.0": 2}
    out = run_cli("status", record["build_id"], "--runs", str(cfg.runs), "--dataset", cfg.dataset, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert f"test audit: 2 environments audited, {stats['audit']['test_runs']} test runs" in out.stdout


def test_export_as_atif_writes_a_valid_document_per_trajectory(built, tmp_path):
    """`trajforge export --format atif` on a committed build (issue 31 item 6): one document per row of
    `trajectories`, each valid for the `atif` package's models; an unknown format is one clear line."""
    from atif import Trajectory

    cfg, _ = built
    out = tmp_path / "atif"
    r = run_cli("export", "--format", "atif", "--out", str(out), "--runs", cfg.runs, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    store = RunStore(cfg.runs, cfg.dataset)
    ids = sorted(pq.read_table(str(Path(cfg.runs) / cfg.dataset / "latest" / "dataset" / "trajectories")).column(
        "rollout_id").to_pylist())
    assert sorted(p.stem for p in out.glob("*.json")) == ids and store.latest()
    for p in out.glob("*.json"):
        doc = Trajectory.model_validate_json(p.read_text())
        assert doc.steps[0].source == "system" and any(s.tool_calls for s in doc.steps if s.source == "agent")
    bad = run_cli("export", "--format", "sharegpt", "--out", str(out), "--runs", cfg.runs, cwd=tmp_path)
    assert bad.returncode == 2 and "--format 'sharegpt': known formats: atif" in bad.stderr


def test_identical_rebuild_reuses_every_stage(built):
    cfg, first = built
    again = run_build(cfg)
    assert again["build_id"] != first["build_id"]
    assert {s["status"] for s in again["stages"].values()} == {"reused"}
    assert all(again["stages"][n]["fingerprint"] == first["stages"][n]["fingerprint"] for n in first["stages"])
    lines = explain_build(RunStore(cfg.runs, cfg.dataset), again["build_id"])
    assert sum("REUSED" in line for line in lines) == 6


def test_only_verify_reruns_verify_against_committed_rollouts(built):
    cfg, first = built
    store = RunStore(cfg.runs, cfg.dataset)
    rollout_manifest = posixpath.join(first["stages"]["rollout"]["manifest"], "manifest.json")
    before = store.read_json(rollout_manifest)
    verify_manifest = posixpath.join(first["stages"]["verify"]["manifest"], "manifest.json")
    old_verify = store.read_json(verify_manifest)["created_at"]
    rec = run_build(cfg, build_id=first["build_id"], only=["verify"], force=["verify"])
    assert rec["stages"]["verify"]["status"] == "committed"
    assert rec["stages"]["rollout"]["status"] == "reused"
    assert store.read_json(rollout_manifest) == before
    assert store.read_json(verify_manifest)["created_at"] != old_verify
    assert rec["stages"]["verify"]["rows"] == 4


def test_change_in_verify_config_reuses_upstream_and_explains(built):
    cfg, _ = built
    changed = cfg.model_copy(update={"verify": cfg.verify.model_copy(update={"test_timeout_s": 45})})
    rec = run_build(changed)
    st = {n: s["status"] for n, s in rec["stages"].items()}
    # verify ran again and wrote the same verdicts (a longer timeout changes none here): what reads them is reused
    assert st == {"propose": "reused", "synthesize": "reused", "rollout": "reused", "verify": "committed", "calibrate": "reused",
                  "export": "reused"}
    text = "\n".join(explain_build(RunStore(cfg.runs, cfg.dataset), rec["build_id"]))
    assert "verify" in text and "its config section changed" in text


def test_planted_failing_expectation_blocks_downstream(built):
    cfg, _ = built
    planted = cfg.model_copy(update={"gate": cfg.gate.model_copy(update={"extra": {"verify": [
        {"type": "expect_column_values_to_be_between", "kwargs": {"column": "reward", "min_value": 2.0}}]}})})
    with pytest.raises(GateFailed) as err:
        run_build(planted)
    msg = str(err.value)
    assert "expect_column_values_to_be_between" in msg and "reward" in msg and "1.0" in msg
    store = RunStore(cfg.runs, cfg.dataset)
    build_id = store.builds()[-1]
    rec = store.read_json(posixpath.join(store.build_dir(build_id), "build.json"))
    assert rec["status"] == "failed" and rec["stages"]["verify"]["status"] == "failed"
    assert "calibrate" not in rec["stages"]
    vdir = store.stage_dir(build_id, "verify", rec["stages"]["verify"]["fingerprint"])
    assert store.exists(posixpath.join(vdir, "gate.json")) and not store.exists(posixpath.join(vdir, "manifest.json"))
    assert store.read_json(posixpath.join(vdir, "gate.json"))["success"] is False


def test_build_on_a_separately_started_dask_scheduler(tmp_path, docker_client, sandbox_cfg):
    sched_file = tmp_path / "scheduler.json"
    env = {**os.environ}
    # --port 0: Dask's default 8786 lies in the range Prefect's temporary API servers draw their ports from
    procs = [subprocess.Popen([venv_bin("dask"), "scheduler", "--scheduler-file", str(sched_file), "--port", "0",
                               "--no-dashboard", "--host", "127.0.0.1"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        for _ in range(100):
            if sched_file.exists() and sched_file.stat().st_size:
                break
            time.sleep(0.2)
        address = json.loads(sched_file.read_text())["address"]
        procs.append(subprocess.Popen([venv_bin("dask"), "worker", address, "--nworkers", "1", "--nthreads", "2",
                                       "--no-dashboard", "--host", "127.0.0.1"], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        from distributed import Client

        with Client(address, timeout=30) as c:
            c.wait_for_workers(1, timeout=60)
            worker_pids = set(c.run(os.getpid).values())
        # a sandbox left by a dead run is removed by the workers themselves (each reaps its host)
        from trajforge.flows.runtime import reap_on_workers
        from trajforge.tasks.sandbox import Sandbox

        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        orphan = Sandbox(docker_client, sandbox_cfg.base_image, sandbox_cfg)
        orphan.labels["trajforge.owner"] = f"{socket.gethostname()}:{dead.pid}"
        orphan.start()
        assert sum(reap_on_workers(address).values()) == 1
        assert not docker_client.containers.list(all=True, filters={"name": orphan.name})
        cfg = parse_config(small_config(tmp_path / "runs", dataset="ext"))
        rec = run_build(cfg, dask_address=address)
        assert rec["status"] == "committed"
        store = RunStore(cfg.runs, cfg.dataset)
        for stage in rec["stages"].values():
            pids = {int(m["worker"].rsplit(":", 1)[1]) for m in _markers(store, stage["manifest"])}
            assert pids <= worker_pids, (pids, worker_pids)
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            p.wait(timeout=30)


def test_kill_9_during_rollout_then_resume_gives_every_rollout_once(tmp_path, docker_client, prefect_api_url):
    import yaml

    cfg = small_config(tmp_path / "runs", dataset="crash", **{"rollout.episodes_per_shard": 1,
                                                             "rollout.samples_per_env": 4, "dask.processes": True})
    path = tmp_path / "crash.yaml"
    path.write_text(yaml.safe_dump(cfg))
    store = RunStore(cfg["runs"], "crash")
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("PREFECT_API_URL", None)
    proc = subprocess.Popen([venv_bin("trajforge"), "build", str(path)], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    done_glob = posixpath.join(store.root, "*", "rollout", "*", "_done", "*")
    deadline = time.time() + 300
    # (a marker being written is a temporary file, not a finished shard: a resume removes it)
    finished = lambda: [p for p in store.fs.glob(done_glob) if ".tmp-" not in posixpath.basename(p)]  # noqa: E731
    while time.time() < deadline and not finished():
        assert proc.poll() is None, "build ended before the crash point"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done_before = {p: Path(p).stat().st_mtime for p in finished()}
    assert 1 <= len(done_before) < 8, "the crash must land in the middle of the rollout stage"
    build_id = store.builds()[-1]
    assert store.read_json(posixpath.join(store.build_dir(build_id), "build.json"))["status"] == "running"

    out = run_cli("build", str(path), cwd=tmp_path, prefect_api=prefect_api_url)  # (the killed one had its own)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"resuming unfinished build {build_id}" in out.stderr
    rec = store.read_json(posixpath.join(store.build_dir(build_id), "build.json"))
    assert rec["status"] == "committed"
    for p, mtime in done_before.items():  # shards finished before the crash were not redone
        assert Path(p).stat().st_mtime == mtime
    rollout_dir = rec["stages"]["rollout"]["manifest"]
    ids = [r for f in sorted(Path(rollout_dir).glob("part-*.parquet"))
           for r in pq.read_table(f, columns=["rollout_id"]).column("rollout_id").to_pylist()]
    assert len(ids) == 8 and len(set(ids)) == 8
    assert rec["stages"]["export"]["rows"] == 8
    # the crashed run's containers were reaped by the resumed one
    left = docker_client.containers.list(all=True, filters={"label": f"trajforge.build={build_id}"})
    assert left == []


def test_cli_errors_are_clear(tmp_path, prefect_api_url):
    out = run_cli("build", "--only", "verfiy", cwd=tmp_path)
    assert out.returncode != 0 and "unknown stage 'verfiy'" in out.stderr
    assert "propose, synthesize, rollout, verify, calibrate, export" in out.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("dataset: x\nsynthesize: {families: []}\nteacher: {backend: gpt}\n")
    out = run_cli("build", str(bad), cwd=tmp_path)
    assert out.returncode != 0 and str(bad) in out.stderr
    assert "synthesize: " in out.stderr and "at least one source" in out.stderr and "teacher.backend" in out.stderr
    good = tmp_path / "good.yaml"
    good.write_text(json.dumps(small_config(tmp_path / "runs", dataset="nodocker")))
    # (the session's Prefect API: the build fails at its first sandbox, and this test is not about its own server)
    out = run_cli("build", str(good), cwd=tmp_path, env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"},
                  prefect_api=prefect_api_url)
    assert out.returncode != 0 and "dockerd --bridge=none" in out.stderr


def test_inflight_cap_holds_across_dask_workers(tmp_path):
    from fake_openai import FakeOpenAI, fenced

    with FakeOpenAI("ok", lambda req, n: fenced("true"), delay_s=0.4) as srv:
        cfg = small_config(tmp_path / "runs", dataset="cap", **{
            "teacher": {"backend": "openai", "endpoints": [srv.url], "model": "fake", "tool_calling": False,
                        "max_inflight_per_endpoint": 3},
            "rollout.samples_per_env": 4, "rollout.episodes_per_shard": 4, "rollout.concurrency": 4,
            "rollout.max_turns": 2, "dask.n_workers": 2, "dask.threads_per_worker": 1,
            "dask.processes": True})
        rec = run_build(parse_config(cfg))
    assert rec["stages"]["rollout"]["status"] == "committed"
    store = RunStore(cfg["runs"], "cap")
    markers = _markers(store, rec["stages"]["rollout"]["manifest"])
    assert len({m["worker"] for m in markers}) == 2, "both workers ran a shard at once"
    assert srv.requests == 16 and srv.max_inflight == 3  # 8 episodes could have asked 8 at once


def test_teacher_server_that_cannot_start_fails_the_build_clearly(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    cfg = small_config(tmp_path / "runs", dataset="down", **{
        "teacher": {"backend": "vllm", "vllm": {"model": str(tmp_path / "model"), "python": sys.executable}}})
    # begun while the environments are made (issue 52): its exit fails the build there and then, naming it
    with pytest.raises(RuntimeError, match=r"teacher service, started early while stage (propose|synthesize) ran, "
                                           r"failed: vLLM server exited with code 1"):
        run_build(parse_config(cfg))
    store = RunStore(cfg["runs"], "down")
    rec = store.read_json(posixpath.join(store.build_dir(store.builds()[-1]), "build.json"))
    assert rec["status"] == "failed" and "exited with code 1" in rec["error"] and "No module named" in rec["error"]
    assert "rollout" not in rec["stages"], rec["stages"]
    assert not store.fs.glob(posixpath.join(store.root, "*", "rollout", "*", "manifest.json"))
    out = run_cli("publish", "org/x", "--build", store.builds()[-1], "--runs", cfg["runs"], cwd=tmp_path)
    assert out.returncode == 1 and "not committed" in out.stderr, out.stderr  # a failed build is never published


def test_publish_uploads_the_declared_configs_and_tags_the_build(built, hub_server, tmp_path):
    """The real huggingface_hub client against the loopback Hub (tests/hub_server.py); more in test_publish.py."""
    from huggingface_hub import HfApi, hf_hub_download

    from trajforge.flows.publish import PublishError, publish

    cfg, record = built
    store = RunStore(cfg.runs, cfg.dataset)
    api = HfApi(endpoint=hub_server.endpoint, token="hf_test")
    rec = publish(store, record["build_id"], "org/flow-trajs", api=api)
    files = hub_server.files("org/flow-trajs", record["build_id"])  # what the tag serves
    uploaded = sorted(p for p in files if p != ".gitattributes")
    assert uploaded[0] == "README.md" and {u.split("/")[0] for u in uploaded[1:]} == set(rec["configs"])
    assert "sft" in rec["configs"] and not any(u.endswith(("manifest.json", "gate.json")) for u in uploaded)
    local = tmp_path / "repo"
    for p in uploaded:
        hf_hub_download("org/flow-trajs", p, repo_type="dataset", revision=record["build_id"], local_dir=local,
                        endpoint=hub_server.endpoint, token="hf_test")
    assert datasets_rows(local, "sft") == 4  # what the Hub serves
    published = store.read_json(posixpath.join(store.build_dir(record["build_id"]), "published.json"))[-1]
    assert published["commit"] == rec["revision"] == hub_server.head("org/flow-trajs")
    with pytest.raises(PublishError, match="not found"):
        publish(store, "19990101T000000Z-dead", "org/flow-trajs", api=api)


def datasets_rows(folder: Path, config: str) -> int:
    import datasets

    return datasets.load_dataset(str(folder), config)["train"].num_rows
