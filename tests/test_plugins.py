"""Extending trajforge from outside: a teacher backend registered by a plugin module runs a real build
(Docker, Prefect, Dask) with no edit to the engine, the flow or the config modules."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from helpers import small_config

from trajforge.schemas.config import ConfigError, parse_config

TESTS = str(Path(__file__).resolve().parent)


@pytest.fixture
def registries():
    """The teacher backend registries restored after the test, and its plugin modules forgotten: a plugin imported
    in this process registers its backend process-wide, which a later test (in any order) must not see."""
    from trajforge.schemas.config import TEACHER_SETTINGS
    from trajforge.tasks.teachers import BACKENDS

    saved = [(reg, dict(reg)) for reg in (TEACHER_SETTINGS, BACKENDS)]
    yield
    for reg, old in saved:
        reg.clear()
        reg.update(old)
    sys.modules.pop("echo_teacher", None)


def test_unknown_backend_names_the_known_ones(tmp_path):
    # (a test plugin another test of the same process imported may be listed too: the built-ins must be)
    with pytest.raises(ConfigError, match=r"teacher.backend: Input should be ") as err:
        parse_config(small_config(tmp_path, teacher={"backend": "no-such-backend"}))
    listed = str(err.value).split("Input should be ", 1)[1].split(" (got ", 1)[0]
    assert all(f"'{name}'" in listed for name in ("openai", "replay", "vllm")), listed
    assert "no-such-backend" not in listed


def test_backend_settings_are_validated_by_the_backend_model(tmp_path):
    with pytest.raises(ConfigError) as err:
        parse_config(small_config(tmp_path, teacher={"backend": "openai", "model": "m", "vllm": {}}))
    assert "teacher.vllm: Extra inputs are not permitted" in str(err.value)
    with pytest.raises(ConfigError, match="backend 'openai' needs `endpoints`"):
        parse_config(small_config(tmp_path, teacher={"backend": "openai", "model": "m"}))
    with pytest.raises(ConfigError, match="plugins: cannot import 'no_such_plugin'"):
        parse_config(small_config(tmp_path, plugins=["no_such_plugin"]))


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api", "registries")
def test_a_plugin_teacher_backend_runs_a_build(tmp_path, monkeypatch):
    from trajforge.flows.launch import run_build
    from trajforge.schemas.trajectory import Rollout
    from trajforge.tasks.engine import RunStore

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))
    cfg = parse_config(small_config(tmp_path / "runs", dataset="echo", plugins=["echo_teacher"],
                                    teacher={"backend": "echo", "text": "hi-from-echo"},
                                    **{"rollout.samples_per_env": 1, "dask.processes": True}))  # imported in workers
    record = run_build(cfg)
    assert record["status"] == "committed"
    store = RunStore(cfg.runs, cfg.dataset)
    rollouts = store.read_records(store.read_json(f"{record['stages']['rollout']['manifest']}/manifest.json")["parts"],
                                  Rollout)
    assert len(rollouts) == 2 and {r.teacher for r in rollouts} == {"echo:hi-from-echo"}
    assert all(r.status == "ok" and [s.command for s in r.steps] == ["echo hi-from-echo"] for r in rollouts)
    assert all(any(m.role == "tool" and "hi-from-echo" in (m.content or "") for m in r.messages) for r in rollouts)


def test_config_errors_name_the_field_and_stay_one_line(tmp_path):
    for teacher, where in [({"backend": ["x"]}, "teacher.backend: Input should be"),
                           (None, "teacher: Input should be a valid dictionary")]:
        with pytest.raises(ConfigError) as err:
            parse_config(small_config(tmp_path, teacher=teacher))
        assert where in str(err.value)
    with pytest.raises(ConfigError, match="plugins: expected a list of module names, got 'echo_teacher'") as err:
        parse_config(small_config(tmp_path, plugins="echo_teacher"))
    assert "(got {" not in str(err.value), "a top-level error must not echo the whole config"


def test_a_config_stored_by_an_older_version_still_opens(tmp_path):
    """Older build.json files carry every backend's settings in each teacher section: `status`,
    `explain` and `stage` read them leniently; a user's YAML with a foreign key is still an error."""
    stored = small_config(tmp_path, teacher={"backend": "replay", "endpoints": [], "vllm": {"model": "x"},
                                             "replay": {"source": "solution"}, "retries": 3})
    cfg = parse_config(stored, "build.json", stored=True)
    assert cfg.teacher.backend == "replay" and cfg.teacher.label == "replay"
    with pytest.raises(ConfigError, match="teacher.vllm: Extra inputs are not permitted"):
        parse_config(stored, "mine.yaml")


def test_dumps_without_defaults_keep_the_backend(tmp_path):
    cfg = parse_config(small_config(tmp_path, teacher={"backend": "openai", "model": "m", "base_url": "http://x/v1"}))
    again = parse_config(cfg.model_dump(mode="json", exclude_defaults=True))
    assert again.teacher.backend == "openai" and again.teacher.label == "openai:m"


@pytest.mark.usefixtures("registries")
def test_plugin_modules_count_in_every_fingerprint(tmp_path, monkeypatch):
    from trajforge.tasks.engine import StageContext, fingerprint_components
    from trajforge.tasks.pipeline import STAGES

    monkeypatch.syspath_prepend(TESTS)
    plain = StageContext.create(parse_config(small_config(tmp_path)), "b")
    plugged = StageContext.create(parse_config(small_config(tmp_path, plugins=["echo_teacher"])), "b")
    for stage in STAGES:
        assert "plugins" not in fingerprint_components(stage, plain, {})
        assert fingerprint_components(stage, plugged, {})["plugins"]
