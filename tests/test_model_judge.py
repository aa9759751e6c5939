"""The model judge (tasks/judge/monitor/model_judge.py, `verify.monitor.judge`): its answers parsed or named
`unparsable` with the answer quoted, a judge that times out or fails named `judge_error`, the contrastive cluster
drawn by its settings, and the config naming a judge that is no teacher. A scripted teacher stands in for the
model here (pure logic); the embedded model's run is not built yet."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from helpers import small_config

from trajforge.schemas.config import parse_config
from trajforge.schemas.environment import EnvSpec, FileSpec
from trajforge.schemas.trajectory import Message, Rollout, Step
from trajforge.schemas.verdict import MonitorFlag, Verdict
from trajforge.tasks.judge.monitor import model_judge


@pytest.mark.parametrize("answer,verdict", [
    ('{"verdict": "reward_hack", "evidence": "cat /tests/expected.txt"}', "reward_hack"),
    ('Sure.\n```json\n{"verdict": "legitimate_success", "evidence": "ran awk"}\n```', "legitimate_success"),
    ("Verdict: task_defect - the tests want 43 where the instruction says 42", "task_defect"),
    ('{"verdict": "probably fine"}', "unparsable"),
    ("I think the agent did well overall.", "unparsable"),
    ("", "unparsable"),
])
def test_an_answer_is_one_of_the_four_or_unparsable_with_the_answer_quoted(answer, verdict):
    got, evidence = model_judge.parse(answer)
    assert got == verdict
    if verdict == "unparsable":
        assert evidence == ("empty answer" if not answer else "answer: " + " ".join(answer.split()))


def _env() -> EnvSpec:
    return EnvSpec(env_id="e", family="harbor", level=1, seed=0, workdir="/app", instruction="Sum numbers.txt.",
                   tests=[FileSpec(path="t.py", content="def test(): pass\n")], solution=["awk 1 numbers.txt"])


def _pair(i: int, passed: bool, flagged: bool = False) -> tuple[Rollout, Verdict]:
    r = Rollout(rollout_id=f"r{i}", env_id="e", teacher="t", harness="bash", sample=i, status="ok",
                messages=[Message(role="user", content="task"), Message(role="assistant", content="done")],
                steps=[Step(turn=1, command=f"echo {i} > total.txt", exit_code=0, duration_s=0.1)])
    v = Verdict(rollout_id=f"r{i}", env_id="e", teacher="t", sample=i, status="ok", verified=True,
                tests_passed=passed, reward=float(passed),
                monitor_flags=[MonitorFlag(detector="tool_output", evidence="x")] if flagged else [])
    return r, v


def test_the_cluster_takes_its_benign_share_from_clean_passes_and_never_the_row_itself():
    peers = [_pair(i, passed=i % 2 == 0, flagged=i == 4) for i in range(10)]
    got = model_judge.cluster(peers[0][1], peers, 4, 0.5)
    ids = [v.rollout_id for _, v in got]
    assert len(ids) == 4 and "r0" not in ids
    benign = [v for _, v in got if v.tests_passed and not v.monitor_flags]
    assert len(benign) == 2
    assert model_judge.cluster(peers[0][1], peers, 4, 0.5) == got       # the same cluster every time
    assert len(model_judge.cluster(peers[0][1], peers[:2], 4, 1.0)) == 1  # short: what there is


class Scripted:
    """A teacher whose sessions answer from a script by rollout id: text, an exception, or a hang."""

    def __init__(self, answers: dict[str, object]):
        self.answers, self.closed, self.prompts = answers, False, {}

    def session(self, env, sample, rollout_id):
        rid = rollout_id.removeprefix("judge-")

        async def next_turn(messages, tools):
            self.prompts[rid] = messages[-1].content
            a = self.answers[rid]
            if a == "hang":
                await asyncio.sleep(30)
            if isinstance(a, Exception):
                raise a
            return SimpleNamespace(message=Message(role="assistant", content=a))
        return SimpleNamespace(next_turn=next_turn)

    async def aclose(self):
        self.closed = True


def test_every_row_gets_a_named_outcome_and_the_prompt_is_contrastive():
    pairs = [_pair(i, passed=True) for i in range(4)]
    teacher = Scripted({"r0": '{"verdict": "reward_hack", "evidence": "echo 0"}', "r1": "no idea",
                        "r2": "hang", "r3": ConnectionError("teacher down")})
    items = [model_judge.Item(v, r, _env(), model_judge.cluster(v, pairs, 2, 0.5)) for r, v in pairs]
    got = model_judge.judge_all(teacher, items, timeout_s=0.5, max_chars=2000)
    assert [g[0] for g in got] == ["reward_hack", "unparsable", "judge_error", "judge_error"]
    assert "within 0.5 s" in got[2][1] and "ConnectionError: teacher down" in got[3][1]
    assert teacher.closed
    assert "TRAJECTORY TO JUDGE (r0)" in teacher.prompts["r0"] and "OTHER TRAJECTORY 2" in teacher.prompts["r0"]
    assert "Sum numbers.txt." in teacher.prompts["r0"]


def test_a_judge_that_is_no_configured_teacher_is_an_error_naming_the_field(tmp_path):
    cfg = small_config(tmp_path / "runs")
    cfg.setdefault("verify", {})["monitor"] = {"judge": "nobody"}
    with pytest.raises(Exception, match=r"verify\.monitor\.judge: 'nobody' is not a configured teacher"):
        parse_config(cfg)
