from pathlib import Path

import pytest

from trajforge.schemas.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parent.parent


def test_demo_config_is_valid():
    cfg = load_config(ROOT / "configs" / "demo.yaml")
    assert cfg.dataset == "demo" and cfg.synthesize.families


def test_bad_field_names_file_and_field(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("dataset: d\nsynthesize: {families: [{name: log_report}]}\nrollout: {samples_per_env: 0, bogus: 1}\n")
    with pytest.raises(ConfigError) as err:
        load_config(p)
    msg = str(err.value)
    assert str(p) in msg and "rollout.samples_per_env" in msg and "rollout.bogus" in msg


def test_missing_section_and_bad_yaml(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("dataset: d\n")
    with pytest.raises(ConfigError, match="synthesize"):
        load_config(p)
    p.write_text("dataset: [unclosed\n")
    with pytest.raises(ConfigError, match="line 2"):
        load_config(p)
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")


def test_extra_teachers_need_distinct_labels_and_one_owned_server(tmp_path):
    p = tmp_path / "c.yaml"
    base = "dataset: d\nsynthesize: {families: [{name: log_report}]}\n"
    p.write_text(base + "extra_teachers: [{backend: replay}]\n")  # the default teacher is `replay` too
    with pytest.raises(ConfigError, match=r"extra_teachers\[0\].*already used by teacher.*name"):
        load_config(p)
    p.write_text(base + "teacher: {backend: replay, name: a}\nextra_teachers: [{backend: vllm}]\n")
    with pytest.raises(ConfigError, match=r"extra_teachers\[0\].*one server"):
        load_config(p)
    p.write_text(base + "extra_teachers: [{backend: replay, name: demo, samples_per_env: 1}]\n")
    cfg = load_config(p)
    assert [t.label for t in cfg.teachers] == ["replay", "demo"] and cfg.teachers[1].samples_per_env == 1


def test_dask_processes_chooses_the_local_clusters_workers_and_changes_no_fingerprint():
    from trajforge.flows.runtime import task_runner
    from trajforge.schemas.config import fingerprint_view, parse_config

    base = {"dataset": "d", "synthesize": {"families": [{"name": "log_report"}]}, "teacher": {"backend": "replay"}}
    default, threads = parse_config(base), parse_config({**base, "dask": {"processes": False}})
    assert default.dask.processes is True and threads.dask.processes is False
    assert fingerprint_view(default.dask) == fingerprint_view(threads.dask)  # how it runs, never what it makes
    for cfg, want in ((default, True), (threads, False)):
        runner = task_runner(None, cfg.dask.n_workers, cfg.dask.threads_per_worker, cfg.dask.processes)
        assert runner.cluster_kwargs["processes"] is want
    assert task_runner("tcp://127.0.0.1:8786", 1, 1, False).address == "tcp://127.0.0.1:8786"
