"""Kept validations by content (tasks/envs/validations.py): a later build that asks the same question (environment
content and id, image id, synthesize code version, admission and sandbox settings) reads the answer back instead of
validating again; any other input, a reject, an entry that does not read, or `synthesize.reuse_validations: false`
validates anew."""

from __future__ import annotations

import pytest
from helpers import run_stage, small_config

from trajforge.schemas.config import parse_config
from trajforge.schemas.environment import VALIDATED
from trajforge.tasks.envs import validations
from trajforge.tasks.envs.families import FAMILIES


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAJFORGE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_key_changes_with_every_input_and_only_with_them(cache):
    env = FAMILIES["log_report"].generate(1, 0)
    base = validations.key(env, "sha256:a", "code1", {"synthesize": {"x": 1}})
    assert base == validations.key(env.model_copy(update={"expected_changes": ["/app/x"]}), "sha256:a", "code1",
                                   {"synthesize": {"x": 1}})  # what validation finds is no input
    others = {validations.key(env, "sha256:b", "code1", {"synthesize": {"x": 1}}),
              validations.key(env, "sha256:a", "code2", {"synthesize": {"x": 1}}),
              validations.key(env, "sha256:a", "code1", {"synthesize": {"x": 2}}),
              validations.key(env.model_copy(update={"env_id": "other"}), "sha256:a", "code1", {"synthesize": {"x": 1}}),
              validations.key(FAMILIES["log_report"].generate(1, 1), "sha256:a", "code1", {"synthesize": {"x": 1}})}
    assert base not in others and len(others) == 5


def test_a_recorded_validation_reads_back_what_it_found_and_a_broken_entry_is_a_miss(cache):
    env = FAMILIES["log_report"].generate(1, 0)
    found = env.model_copy(update={"expected_changes": ["/home/agent/work/report.txt"], "tests_run_agent_code": "no"})
    assert validations.recall("ab" * 32, env) is None
    validations.record("ab" * 32, found)
    back = validations.recall("ab" * 32, env)
    assert back is not None and {k: getattr(back, k) for k in VALIDATED} == {k: getattr(found, k) for k in VALIDATED}
    assert back.instruction == env.instruction
    (cache / "validations" / "ab" / f"{'ab' * 32}.json").write_text("{not json")
    assert validations.recall("ab" * 32, env) is None


@pytest.mark.docker
def test_a_second_build_reads_the_kept_validations_back_and_reuse_off_validates_again(tmp_path, cache, docker_client):
    """Two run folders (as two users' builds on one host): the second synthesize stage validates nothing that the
    first kept, and its environments carry the same findings; with `reuse_validations: false` it validates again."""
    from trajforge.tasks.engine import StageContext
    from trajforge.tasks.propose import ProposeStage
    from trajforge.tasks.synthesize import SynthesizeStage

    def synthesize(runs: str, **over):
        cfg = parse_config(small_config(tmp_path / runs, **over))
        ctx = StageContext.create(cfg, "b1")
        _, proposed = run_stage(ProposeStage(), ctx, {})
        _, made = run_stage(SynthesizeStage(), ctx, {"propose": proposed})
        rows = {e.env_id: e for e in ctx.store.read_records(made.parts, type(FAMILIES["log_report"].generate(1, 0)))}
        return made.stats, rows

    first, envs = synthesize("a")
    assert first.get("validations_reused", 0) == 0 and first["validation_seconds"] > 0 and len(envs) == 2
    second, again = synthesize("b")
    assert second.get("validations_reused") == 2 and second["validation_seconds"] == 0
    assert {i: {k: getattr(e, k) for k in VALIDATED} for i, e in again.items()} == \
        {i: {k: getattr(e, k) for k in VALIDATED} for i, e in envs.items()}
    assert {i: e.image for i, e in again.items()} == {i: e.image for i, e in envs.items()}
    third, _ = synthesize("c", **{"synthesize.reuse_validations": False})
    assert third.get("validations_reused", 0) == 0 and third["validation_seconds"] > 0
