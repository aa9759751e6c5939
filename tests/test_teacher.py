"""Teachers and the agent harness against OpenAI-compatible endpoints that misbehave on purpose, with
real sandboxes: outages end episodes as `teacher_error` (never a crash, never the model's failure),
routing is sticky, dead endpoints leave the rotation, the in-flight cap holds, bad model output is a
`format_error` turn fed back."""

from __future__ import annotations

import json

import pytest
from fake_openai import FakeOpenAI, fenced, tool_call
from helpers import small_config

from trajforge.schemas.config import parse_config
from trajforge.tasks.agent.driver import run_episodes
from trajforge.tasks.engine import StageContext
from trajforge.tasks.teachers.base import stable_hash as _h

pytestmark = pytest.mark.docker


def ctx_for(tmp_path, urls, **teacher):
    cfg = small_config(tmp_path / "runs")
    cfg["teacher"] = {"backend": "openai", "endpoints": urls, "model": "fake", "retries": 1,
                      "request_timeout_s": 3, "tool_calling": False, **teacher}
    cfg["rollout"].update(max_turns=3, concurrency=4, command_timeout_s=10)
    return StageContext.create(parse_config(cfg), "b")


def episodes(envs, k=2):
    return [(e, s) for e in sorted(envs) for s in range(k)]


@pytest.mark.parametrize("mode", ["500", "hang", "close"])
def test_endpoint_outage_ends_episodes_as_teacher_error_and_the_shard_finishes(tmp_path, envs, mode):
    with FakeOpenAI(mode) as srv:
        res = run_episodes(ctx_for(tmp_path, [srv.url]), envs, episodes(envs))
    assert [r.status for r in res.rows] == ["teacher_error"] * 4
    assert all("failed after 2 attempt(s)" in r.error for r in res.rows)
    assert res.stats["status"] == {"teacher_error": 4}
    assert srv.requests == 8  # retries + 1 per episode's first turn, then the episode ends


def test_unparseable_output_is_fed_back_as_format_error(tmp_path, envs):
    def script(req, n):
        return {"role": "assistant", "content": "I think the answer is probably in the logs somewhere."}

    with FakeOpenAI("ok", script) as srv:
        res = run_episodes(ctx_for(tmp_path, [srv.url]), envs, episodes(envs, 1))
    for r in res.rows:
        assert r.status == "format_error" and r.turns == 3
        feedback = [m.content for m in r.messages if m.role == "user"][1:]
        assert len(feedback) == 3 and all(f.startswith("format error: no command found") for f in feedback)


def test_model_that_never_submits_ends_at_max_turns_and_history_is_linear(tmp_path, envs):
    with FakeOpenAI("ok", lambda req, n: fenced("echo hi; ls")) as srv:
        res = run_episodes(ctx_for(tmp_path, [srv.url]), envs, episodes(envs, 1))
    r = res.rows[0]
    assert r.status == "max_turns" and r.turns == 3 and len(r.steps) == 3
    assert [m.role for m in r.messages] == ["system", "user"] + ["assistant", "user"] * 3
    assert r.messages[3].content.startswith("Output:\n[exit code 0]\nhi")
    assert r.completion_tokens == 36 and r.prompt_tokens > 0
    # the history sent on turn 3 is exactly what was stored for turns 1-2 (no re-templating)
    mine = [b["messages"] for b in srv.bodies if b["messages"][1]["content"] == r.messages[1].content]
    last = max(mine, key=len)
    assert len(last) == 6 and last == [m.api_dict() for m in r.messages[:6]]


@pytest.mark.parametrize("tool_choice", ["auto", "required"])
def test_tool_calling_episode_submits_and_counts(tmp_path, envs, tool_choice):
    def script(req, n):
        turns = sum(1 for m in req["messages"] if m["role"] == "assistant")
        return tool_call("cat TASK.md 2>/dev/null; ls" if turns == 0 else None, turns)

    with FakeOpenAI("ok", script) as srv:
        res = run_episodes(ctx_for(tmp_path, [srv.url], tool_calling=True, seed=7, tool_choice=tool_choice), envs,
                           episodes(envs, 1))
    for r in res.rows:
        assert r.status == "ok" and r.turns == 2
        assert r.messages[2].tool_calls[0].function.name == "bash"
        assert r.messages[3].role == "tool" and r.messages[3].tool_call_id == "call_0"
        assert json.loads(r.tools_json)[0]["function"]["name"] == "bash"
    assert "tools" in srv.bodies[0] and srv.bodies[0]["seed"] != srv.bodies[1]["seed"]
    # `auto` is the API's default: not sent; `required` travels with every request that offers tools
    assert [b.get("tool_choice") for b in srv.bodies] == [None if tool_choice == "auto" else tool_choice] * len(srv.bodies)


def test_sticky_routing_and_dead_endpoint_leaves_rotation(tmp_path, envs):
    with FakeOpenAI("ok", lambda req, n: fenced("true")) as a, FakeOpenAI("ok", lambda req, n: fenced("true")) as b:
        res = run_episodes(ctx_for(tmp_path, [a.url, b.url]), envs, episodes(envs, 4))
        for r in res.rows:  # every turn of an episode went to the server its rendezvous hash ranks first
            expected = max((a.url, b.url), key=lambda u: _h(f"{u}|{r.rollout_id}"))
            assert {u.endpoint for u in r.usage} == {expected}
        assert a.requests + b.requests == sum(r.turns for r in res.rows)
    with FakeOpenAI("500") as dead, FakeOpenAI("ok", lambda req, n: fenced("true")) as good:
        ctx = ctx_for(tmp_path, [dead.url, good.url], retries=2, dead_after_failures=1, dead_cooldown_s=60)
        res = run_episodes(ctx, envs, episodes(envs, 4))
    assert {r.status for r in res.rows} == {"max_turns"}
    assert all({u.endpoint for u in r.usage} == {good.url} for r in res.rows)
    # only the requests already in flight when it failed (concurrency 4) reached it, of 24 turns
    assert dead.requests <= 4, "a dead endpoint leaves the rotation after its failures"


def test_inflight_cap_per_endpoint(tmp_path, envs):
    with FakeOpenAI("ok", lambda req, n: fenced("true"), delay_s=0.3) as srv:
        ctx = ctx_for(tmp_path, [srv.url], max_inflight_per_endpoint=2)
        ctx.config.rollout.concurrency = 8
        run_episodes(ctx, envs, episodes(envs, 4))
    assert srv.max_inflight == 2


def test_context_budget_ends_episode_as_context_overflow(tmp_path, envs):
    with FakeOpenAI("ok", lambda req, n: fenced("seq 1 50")) as srv:
        ctx = ctx_for(tmp_path, [srv.url], max_tokens=64)
        ctx.config.rollout.context_budget_tokens = 256
        ctx.config.rollout.max_turns = 10
        res = run_episodes(ctx, envs, episodes(envs, 1))
    for r in res.rows:
        assert r.status == "context_overflow" and "exceeds the budget 256" in r.error
        assert r.usage[-1].prompt_tokens + r.usage[-1].completion_tokens + 64 > 256


def test_docker_failure_is_retried_then_infra_error(tmp_path, envs):
    broken = {k: v.model_copy(update={"image": "trajforge/env:does-not-exist"}) for k, v in envs.items()}
    with FakeOpenAI("ok", lambda req, n: fenced("true")) as srv:
        ctx = ctx_for(tmp_path, [srv.url])
        res = run_episodes(ctx, broken, episodes(broken, 1))
    for r in res.rows:
        assert r.status == "infra_error" and r.attempts == 3 and "not found" in r.error
    assert res.stats["infra_retries"] == 6


def test_oom_command_is_reported_and_the_episode_goes_on(tmp_path, envs):
    def script(req, n):
        turns = sum(1 for m in req["messages"] if m["role"] == "assistant")
        return fenced("python3 -c 'x = bytearray(600 * 2**20)'" if turns == 0 else "echo recovered")

    with FakeOpenAI("ok", script) as srv:
        ctx = ctx_for(tmp_path, [srv.url])
        ctx.config.sandbox.memory_mb = 128
        res = run_episodes(ctx, envs, episodes(envs, 1)[:1])
    r = res.rows[0]
    assert r.steps[0].killed_by == "oom" and r.steps[0].exit_code == 137
    assert "[killed: out of memory]" in r.messages[3].content
    assert r.steps[1].exit_code == 0 and r.status == "max_turns"
    assert res.stats["killed_by"] == {"oom": 1}
