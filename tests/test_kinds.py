"""The environment-kind registry (tasks/envs/kinds.py): a toy third kind registered from a test reaches
every place that differs by kind (records, harness label and agent mode, replay rendering, `envs sample`,
the validator's checks) without a branch for it anywhere."""

from __future__ import annotations

import asyncio
import json
import random

import pytest
from typer.testing import CliRunner

from trajforge.flows.cli import app
from trajforge.schemas.common import FileSpec
from trajforge.schemas.config import SandboxConfig, SynthesizeConfig
from trajforge.schemas.environment import ENV_KINDS, EnvSpec
from trajforge.tasks.agent import harness
from trajforge.tasks.envs import families, kinds
from trajforge.tasks.envs.families.base import Draft, Family
from trajforge.tasks.sandbox import FinalStateUnavailable
from trajforge.tasks.teachers.replay import ReplayTeacher, ReplayTeacherConfig

TOY_HARNESS = "toy-browser-v1"


def _page_check(sb, env: EnvSpec, timeout_s: float) -> str | None:
    res = sb.exec("cat page.html", timeout_s)
    return None if "<title>" in res.output else f"page.html has no title: {res.output[-200:]!r}"


def _click(command: str):
    return ("click", {"selector": command.removeprefix("click ")}) if command.startswith("click ") else None


class _ToyPages(Family):
    name = "toy_pages"
    description = "a toy family of the toy `browser` kind"
    kind = "browser"
    levels = (1,)

    def draft(self, level: int, rng: random.Random) -> Draft:
        raise NotImplementedError

    def generate(self, level: int, seed: int) -> EnvSpec:
        return self.env(level, seed, kind="browser", instruction="Click the button labelled OK.",
                        files=[FileSpec(path="page.html", content="<title>t</title><button>OK</button>\n")],
                        tests=[FileSpec(path="test_task.py", content="def test_x():\n    assert False\n")],
                        solution=["click button"])


@pytest.fixture
def toy_kind():
    kind = kinds.register(kinds.Kind(
        name="browser", agent_mode="bash", harness=TOY_HARNESS,
        checks=(kinds.KindCheck("page_loads", "page_broken", _page_check),), replay_call=_click,
        view=lambda env, tests: {"kind": env.kind, "page": env.files[0].content, "tests": len(env.tests) if tests else 0}))
    families.register(_ToyPages())
    yield kind
    kinds.KINDS.pop("browser")
    ENV_KINDS.discard("browser")
    families.FAMILIES.pop("toy_pages")


def test_the_built_in_kinds_are_registered():
    assert set(kinds.KINDS) == {"terminal", "tools"} and {"terminal", "tools"} <= ENV_KINDS
    assert kinds.get("terminal").harness == harness.HARNESS and kinds.get("terminal").checks == ()
    assert [c.name for c in kinds.get("tools").checks] == ["tools_serve"]
    with pytest.raises(KeyError, match="unknown environment kind 'gui'; known: terminal, tools"):
        kinds.get("gui")


def test_an_unregistered_kind_is_refused_by_the_record():
    with pytest.raises(ValueError, match="unknown environment kind 'browser'"):
        EnvSpec(env_id="x", kind="browser", family="f", level=1, seed=0, instruction="do", tests=[])


def test_a_toy_kind_is_a_record_with_its_harness_label(toy_kind):
    env = families.get_family("toy_pages").generate(1, 0)
    assert env.kind == "browser" and env.env_id.startswith("toy_pages-l1-s0-")
    assert kinds.of(env) is toy_kind and harness.harness_label(env) == TOY_HARNESS


def test_a_toy_kind_replays_commands_as_its_tool_calls(toy_kind):
    env = families.get_family("toy_pages").generate(1, 0)
    session = ReplayTeacher(ReplayTeacherConfig(backend="replay")).session(env, 0)
    turn = asyncio.run(session.next_turn([], [{"type": "function"}]))
    call = turn.message.tool_calls[0].function
    assert (call.name, json.loads(call.arguments)) == ("click", {"selector": "button"})
    fenced = ReplayTeacher(ReplayTeacherConfig(backend="replay")).session(env, 0)
    text = asyncio.run(fenced.next_turn([], [])).message.content
    assert json.loads(text.strip("`").removeprefix("json")) == {"tool": "click", "arguments": {"selector": "button"}}


def test_envs_sample_prints_the_kinds_view(toy_kind):
    res = CliRunner().invoke(app, ["envs", "sample", "toy_pages", "--level", "1", "--tests"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output) == {"kind": "browser", "page": "<title>t</title><button>OK</button>\n", "tests": 1}


def test_the_harness_runs_the_mode_the_kind_names(toy_kind, monkeypatch):
    """The episode's turns come from `MODES[kind.agent_mode]`: a mode registered for the toy kind is the
    one the harness asks for its tools and prompt."""
    seen = []

    class _Mode:
        what = "click"

        def __init__(self, ep, env):
            seen.append(env.env_id)

        async def offered(self):
            return []

        def system_prompt(self, env):
            return "toy"

    class _Box:
        toolchain_changed, image, container = [], "toy", type("C", (), {"attrs": {}})()
        cfg = SandboxConfig()
        stopped = None  # (the agent never stopped it: Sandbox.stopped)

        def start(self):
            return None

        def digests(self, paths):
            return {}

        def settle(self, protected):  # nothing to capture: the episode ends without a final state
            raise FinalStateUnavailable("a toy box keeps nothing")

        def close(self):
            return None

    class _Session:
        async def next_turn(self, messages, tools):
            raise harness.TeacherError("no teacher here")

    monkeypatch.setitem(harness.MODES, "toy", _Mode)
    kinds.register(kinds.Kind(name="browser", agent_mode="toy", harness=TOY_HARNESS))
    env = families.get_family("toy_pages").generate(1, 0)
    settings = harness.EpisodeSettings(max_turns=2, command_timeout_s=5, episode_timeout_s=30)
    r = asyncio.run(harness.run_episode(env, _Session(), _Box, settings, "t", 0))
    assert seen == [env.env_id] and r.harness == TOY_HARNESS and r.status == "teacher_error"
    assert r.error.startswith("no teacher here")
    assert [m.content for m in r.messages] == ["toy", env.instruction]


@pytest.mark.docker
def test_the_validator_runs_the_kinds_checks(toy_kind, docker_client):
    from trajforge.tasks.envs.validator import validate_env

    aliases = SynthesizeConfig(families=[{"name": "log_report"}]).image_aliases
    good = families.get_family("toy_pages").generate(1, 0)
    good.solution = []
    good.oracle = "absent"
    v = validate_env(docker_client, good, SandboxConfig(), "trajforge/base:latest", aliases, 30, 30)
    assert v.ok, v.reject
    assert v.checks["page_loads"] == "pass" and "tools_serve" not in v.checks
    broken = good.model_copy(update={"files": [FileSpec(path="page.html", content="<p>no title</p>\n")]})
    v = validate_env(docker_client, broken, SandboxConfig(), "trajforge/base:latest", aliases, 30, 30)
    assert v.reject.reason == "page_broken" and v.checks["page_loads"] == "fail"
    assert "page.html has no title" in v.reject.detail
