"""The build's `EARLY` services at the engine level (flows/build.py `_Build`): a service a later stage declares is
begun while an upstream stage runs shards, handed to that stage's service when it comes, stopped at once when
that stage turns out to have nothing to run (reused, or no shard pending), and a start that died meanwhile is named.
No Docker, no Prefect flow: the `_Build` of a real config and pipeline, its service table patched with a stand-in
whose handle records what happens to it."""

from __future__ import annotations

import pytest
from helpers import small_config

from trajforge.flows import build as engine
from trajforge.schemas.config import parse_config


class Handle:
    def __init__(self, events: list[str], why: str | None = None):
        self.events, self.why = events, why

    def failed(self) -> str | None:
        return self.why

    def stop(self) -> None:
        self.events.append("stop")


@pytest.fixture
def build(tmp_path, monkeypatch):
    events: list[str] = []
    handles: list[Handle] = []

    def launch(cfg, ctx, console):
        events.append("launch")
        handles.append(Handle(events))
        return handles[-1]

    monkeypatch.setitem(engine.EARLY, "teacher", launch)
    cfg = parse_config(small_config(tmp_path / "runs", dataset="early"))
    graph = engine.load_pipeline(engine.DEFAULT_PIPELINE)
    b = engine._Build(engine.DEFAULT_PIPELINE, cfg, "b-early", graph.select(None, None), set())
    b.lease = None
    yield b, events, handles
    b.services.close()


def test_a_service_begun_early_for_a_stage_with_nothing_to_run_is_stopped_then(build, capsys):
    b, events, handles = build
    b._launch_early("calibrate")  # no stage after calibrate declares the teacher: nothing begins
    assert events == [] and b.early == {}
    b._launch_early("propose")  # rollout (selected, not committed) reads propose's rows through synthesize's
    assert events == ["launch"] and b.early == {"teacher": handles[0]}
    b._launch_early("synthesize")  # begun once
    assert events == ["launch"]
    b._drop_early(b.pipeline.stage("verify"))  # a stage that does not declare it leaves it running
    assert events == ["launch"] and "teacher" in b.early
    b._drop_early(b.pipeline.stage("rollout"))  # reused, or nothing pending: stopped now, not at the build's end
    assert events == ["launch", "stop"] and b.early == {}
    said = capsys.readouterr()
    assert "teacher    begun early but not needed (rollout has nothing to run): stopped" in said.out + said.err


def test_no_early_start_for_a_stage_that_is_not_selected_or_already_committed(build):
    b, events, _ = build
    b.selected = [s for s in b.selected if s != "rollout"]
    b._launch_early("synthesize")
    assert events == []
    b.selected.append("rollout")
    b.manifests["rollout"] = object()  # committed (reused) before its upstream ran: nothing to begin
    b._launch_early("synthesize")
    assert events == []


def test_a_start_that_died_meanwhile_is_named_with_its_service_and_stage(build):
    b, events, handles = build
    assert b._early_failure("synthesize") is None
    b._launch_early("synthesize")
    assert b._early_failure("synthesize") is None
    handles[0].why = "vLLM server exited with code 1"
    assert b._early_failure("synthesize") == (
        "the teacher service, started early while stage synthesize ran, failed: vLLM server exited with code 1")


def test_a_handle_still_held_when_the_build_ends_is_stopped_with_its_services(build):
    b, events, _ = build
    b._launch_early("synthesize")
    b.services.close()
    assert events == ["launch", "stop"]
