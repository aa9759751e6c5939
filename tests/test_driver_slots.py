"""The rollout driver's two bounds (issue 14, teacher utilization), no Docker: `rollout.concurrency`
conversations with the teacher in flight, episodes that start their container before a slot is free,
and an episode whose conversation is over gives its slot to the next one while it finishes (settle,
capture, hidden tests), with at most 2 x concurrency episodes holding containers. `run_episode` is replaced by a probe that records what is in flight."""

from __future__ import annotations

import asyncio
import threading

import pytest
from helpers import small_config

from trajforge.schemas.common import FileSpec
from trajforge.schemas.config import parse_config
from trajforge.schemas.environment import EnvSpec
from trajforge.schemas.trajectory import Message, Rollout
from trajforge.tasks.agent import driver
from trajforge.tasks.engine import StageContext
from trajforge.tasks.sandbox import SandboxError


class Probe:
    """Counts conversations and live episodes; `finish_s` is the sandbox work after the conversation."""

    def __init__(self, talk_s: float, finish_s: float, fail_first: set[int] = frozenset(),
                 fail_in_finish: bool = False):
        self.talk_s, self.finish_s, self.fail_first, self.fail_in_finish = talk_s, finish_s, set(fail_first), fail_in_finish
        self.talking = self.alive = self.max_talking = self.max_alive = 0
        self.finishing_while_full = 0  # moments at which C conversations ran beside a finishing episode
        self.conc = 0

    async def __call__(self, env, session, make_sandbox, s, teacher, sample, slot=None) -> Rollout:
        self.alive += 1
        self.max_alive = max(self.max_alive, self.alive)
        try:
            await slot.acquire()  # the container is starting (run_episode: before the slot)
        except BaseException:
            self.alive -= 1
            raise
        self.talking += 1
        talked = False
        self.max_alive, self.max_talking = max(self.max_alive, self.alive), max(self.max_talking, self.talking)
        try:
            await asyncio.sleep(self.talk_s)
            self.talking -= 1
            talked = True
            if sample in self.fail_first and not self.fail_in_finish:
                self.fail_first.discard(sample)
                raise SandboxError("planted: the container died mid-conversation")
            slot.release()
            await asyncio.sleep(0)  # the freed slot is taken by a waiting episode
            if self.talking == self.conc:
                self.finishing_while_full += 1
            await asyncio.sleep(self.finish_s)
            if sample in self.fail_first:
                self.fail_first.discard(sample)
                raise SandboxError("planted: capture failed")
            return Rollout(rollout_id=f"r{sample}", env_id=env.env_id, teacher=teacher, harness="h", sample=sample,
                           messages=[Message(role="user", content="x")], status="max_turns")
        finally:
            self.alive -= 1
            if not talked:
                self.talking -= 1


class NoTeacher:
    label = "t"

    def session(self, env, sample, rid):
        return None

    async def aclose(self):
        pass


class NoDocker:
    def close(self):
        pass


def run(monkeypatch, tmp_path, probe: Probe, conc: int, n: int, retries: int = 0):
    cfg = small_config(tmp_path / "runs")
    cfg["rollout"].update(concurrency=conc, infra_retries=retries)
    ctx = StageContext.create(parse_config(cfg), "b")
    monkeypatch.setattr(driver, "run_episode", probe)
    monkeypatch.setattr(driver, "docker_client", lambda pool_size, sandbox=None: NoDocker())
    env = EnvSpec(env_id="e", family="f", level=1, seed=0, instruction="do", image="img:1",
                  tests=[FileSpec(path="test_x.py", content="def test_a(): pass")])
    probe.conc = conc
    return driver.run_episodes(ctx, {"e": env}, [("e", i) for i in range(n)], teacher=NoTeacher())


def test_finishing_episodes_give_their_teacher_slot_to_the_next_conversation(monkeypatch, tmp_path):
    probe = Probe(talk_s=0.05, finish_s=0.2)
    res = run(monkeypatch, tmp_path, probe, conc=4, n=24)
    assert len(res.rows) == 24 and {r.status for r in res.rows} == {"max_turns"}
    assert probe.max_talking == 4, "never more conversations than rollout.concurrency"
    assert probe.finishing_while_full > 0, "a finishing episode kept a conversation slot"
    assert 4 < probe.max_alive <= 8, "finishing episodes beside the conversations, at most 2 x concurrency"


def test_a_retried_episode_takes_a_slot_again_and_never_leaks_one(monkeypatch, tmp_path):
    """A SandboxError in the conversation or after it (slot already given back): the retry waits for a
    slot like any episode, and the bounds still hold to the end (a leaked or doubly released slot
    would let more than `concurrency` conversations run)."""
    for in_finish in (False, True):
        probe = Probe(talk_s=0.03, finish_s=0.05, fail_first={0, 3, 5}, fail_in_finish=in_finish)
        res = run(monkeypatch, tmp_path, probe, conc=2, n=12, retries=1)
        assert [r.status for r in res.rows] == ["max_turns"] * 12 and res.stats["infra_retries"] == 3
        assert probe.max_talking == 2 and probe.max_alive <= 4
        assert probe.talking == 0 and probe.alive == 0


@pytest.mark.docker
def test_the_harness_starts_the_container_before_its_slot_and_frees_the_slot_before_settling(docker_client):
    """Real container, scripted teacher: the slot is acquired only once the container start is under way
    (a slot that waits for the start would otherwise wait forever), the conversation happens inside the
    slot, and the slot is back before `settle` (the episode's end-of-life Docker work) begins."""
    from trajforge.schemas.config import SandboxConfig
    from trajforge.tasks.agent.harness import EpisodeSettings, run_episode
    from trajforge.tasks.envs.images import ensure_image
    from trajforge.tasks.sandbox import Sandbox
    from trajforge.tasks.teachers.base import Turn

    events: list[str] = []
    started = threading.Event()

    class Recorded(Sandbox):
        def start(self):
            events.append("start")
            started.set()
            return super().start()

        def settle(self, *a, **k):
            events.append("settle")
            return super().settle(*a, **k)

    class WaitsForTheStart:
        async def acquire(self):
            for _ in range(600):
                if started.is_set():
                    events.append("acquire")
                    return
                await asyncio.sleep(0.05)
            raise AssertionError("the slot was asked for before the container start began")

        def release(self):
            events.append("release")

    class Teacher:
        async def next_turn(self, messages, tools):
            events.append("turn")
            text = "```bash\necho hi > out.txt\n```" if len(messages) == 2 else "done"
            return Turn(Message(role="assistant", content=text), completion_tokens=5, finish_reason="stop")

    env = EnvSpec(env_id="slots", family="f", level=1, seed=0, instruction="write out.txt",
                  tests=[FileSpec(path="test_x.py", content="def test_a(): pass")])
    env.image, _ = ensure_image(docker_client, "trajforge/base:latest", env)
    s = EpisodeSettings(max_turns=2, command_timeout_s=20, episode_timeout_s=120, tool_calling=False)
    r = asyncio.run(run_episode(env, Teacher(), lambda: Recorded(docker_client, env.image, SandboxConfig(),
                                                                  workdir=env.workdir), s, "t", 0,
                                slot=WaitsForTheStart()))
    assert r.steps and r.steps[0].command.startswith("echo hi")
    assert events == ["start", "acquire", "turn", "turn", "release", "settle"]
