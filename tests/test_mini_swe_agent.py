"""Harness `mini-swe-agent` (tasks/agent/harnesses/mini_swe_agent.py, issue 44): the third-party scaffold's own agent
loop, templates, parsing and ending, bridged to trajforge's episode loop. Fast: whole episodes through
`run_episode` with a scripted teacher session and an in-memory sandbox (what the scaffold sent is what the
rollout stores, one recorded turn per model call, its format errors and endings as named outcomes, the budget
stopping it), the replay rendering parsed by the package's own parser, the named error of a missing package;
against real Docker: a small replay build through the scaffold committing a passing row."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import posixpath
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import pytest
from helpers import run_stage

from trajforge.schemas.common import ChangeSet
from trajforge.schemas.environment import EnvSpec, FileSpec
from trajforge.schemas.trajectory import Message
from trajforge.tasks.agent import harnesses
from trajforge.tasks.agent.harness import EpisodeSettings, run_episode
from trajforge.tasks.agent.harnesses import mini_swe_agent as msa
from trajforge.tasks.sandbox import ExecResult, SandboxError
from trajforge.tasks.teachers.base import TeacherError, Turn
from trajforge.tasks.teachers.replay import _ReplaySession

NAME = msa.NAME
MARK = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def _empty_tar() -> bytes:
    buf = io.BytesIO()
    tarfile.open(fileobj=buf, mode="w").close()
    return buf.getvalue()


class _Container:
    attrs = {"Image": "sha256:fake"}


class _Cfg:
    work_tmpfs_mb = 0


class FakeSandbox:
    """What `run_episode` asks of a sandbox, in memory: `exec` answers from `answers` (command -> output) and
    records the command with its variables; `echo X` prints X."""

    def __init__(self, answers: dict[str, tuple[int, str]] | None = None, fail_on: str | None = None):
        self.answers, self.fail_on = answers or {}, fail_on
        self.ran: list[tuple[str, float, dict]] = []
        self.image, self.container, self.cfg, self.workdir = "fake", _Container(), _Cfg(), "/work"
        self.toolchain_allowed, self.fresh, self.toolchain_changed = (), False, []
        self.stopped, self.episode_container, self.closed = None, None, False

    def start(self):
        pass

    def digests(self, protected):
        return {}

    def exec(self, command, timeout_s, env=None, **kw):
        self.ran.append((command, timeout_s, env or {}))
        if command == self.fail_on:
            raise SandboxError("docker went away")
        if command in self.answers:
            code, out = self.answers[command]
        elif command.startswith("echo "):
            code, out = 0, command[5:] + "\n"
        else:
            code, out = 0, ""
        return ExecResult(exit_code=code, output=out, duration_s=0.01, timed_out=code == 124,
                          output_bytes=len(out), truncated=False)

    def settle(self, protected):
        return 0, {}, ChangeSet()

    def capture_work(self, limit):
        return _empty_tar()

    def close(self):
        self.closed = True


class Scripted:
    """A teacher session replying `replies` in order, recording each request's messages; every turn reports
    tokens and token ids, as a vLLM server does."""

    def __init__(self, replies: list[str | Exception]):
        self.replies, self.seen, self.tools = list(replies), [], []

    async def next_turn(self, messages, tools):
        self.seen.append([m.model_dump() for m in messages])
        self.tools.append(tools)
        item = self.replies.pop(0)
        if isinstance(item, Exception):
            raise item
        if isinstance(item, Turn):
            return item
        k = len(self.seen)
        return Turn(Message(role="assistant", content=item), prompt_tokens=10 * k, completion_tokens=k,
                    latency_s=0.001, finish_reason="stop", prompt_token_ids=list(range(10 * k)),
                    completion_token_ids=[900 + k] * k)


def _env() -> EnvSpec:
    return EnvSpec(env_id="msa", family="f", level=1, seed=0, instruction="Write hello to out.txt.",
                   tests=[FileSpec(path="test_x.py", content="def test_a(): pass")])


def _episode(replies, sb=None, max_turns=10):
    sb = sb or FakeSandbox()
    session = Scripted(replies)
    s = EpisodeSettings(max_turns=max_turns, command_timeout_s=20, episode_timeout_s=120, tool_calling=False)
    r = asyncio.run(run_episode(_env(), session, lambda: sb, s, "scripted", 0, harness=NAME))
    return r, session, sb


def block(command: str, thought: str = "THOUGHT: next.") -> str:
    return f"{thought}\n\n```mswea_bash_command\n{command}\n```"


def _alive() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name == f"{NAME}-agent" and t.is_alive()]


def test_the_scaffold_is_registered_and_its_regex_is_the_packages_own():
    h = harnesses.get(NAME)
    assert h.kinds == ("terminal",) and h.mode is msa.MiniSweAgentMode and h.render is msa.render
    import minisweagent

    source = (Path(minisweagent.__file__).parent / "models" / "litellm_textbased_model.py").read_text()
    assert f'action_regex: str = r"{msa.ACTION_REGEX}"' in source  # copied, so litellm is never imported


def test_an_episode_is_what_the_scaffold_sent_and_each_call_a_recorded_turn():
    replies = [block("ls -la", "THOUGHT: look first."), "I will just think about it.",
               block("echo hello > out.txt"), block(f"echo {MARK}")]
    r, session, sb = _episode(replies)
    assert r.status == "ok" and r.error is None and r.harness == NAME and r.tools_json == "[]"
    assert session.tools == [[]] * 4  # text-based: no tools offered
    # the scaffold's own templates (its default.yaml), the instruction as its {{task}}
    system, user = r.messages[0], r.messages[1]
    assert system.role == "system" and system.content.startswith("You are a helpful assistant that can interact")
    assert user.role == "user" and user.content.startswith("Please solve this issue: Write hello to out.txt.")
    assert "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" in user.content
    # every request was the stored conversation as it stood: what the scaffold sent is what the rollout holds
    stored = [m.model_dump() for m in r.messages]
    for k, seen in enumerate(session.seen):
        assert seen == stored[:len(seen)] or k == 2, k
    # the unparseable reply was dropped from the scaffold's history (mini-swe-agent 2.x), its format error kept
    assert all(m.content != "I will just think about it." for m in r.messages)
    third = session.seen[2]
    assert third[-1]["role"] == "user" and "Expected exactly 1 action, found 0." in third[-1]["content"]
    assert third[-2]["role"] == "user" and "<returncode>0</returncode>" in third[-2]["content"]
    assert [m.role for m in r.messages[2:]] == ["assistant", "user", "user", "assistant", "user", "assistant"]
    assert r.messages[-1].content == block(f"echo {MARK}")
    # one recorded turn per model call, tokens and ids joined to the rollout
    assert [u.turn for u in r.usage] == [1, 2, 3, 4] and r.turns == 4
    assert [u.completion_tokens for u in r.usage] == [1, 2, 3, 4] and r.completion_tokens == 10
    assert r.usage[3].completion_token_ids == [904] * 4 and r.usage[1].prompt_new_token_ids is not None
    # the commands ran in the sandbox as steps of their turns, with the scaffold's variables
    assert [(s.turn, s.command) for s in r.steps] == [(1, "ls -la"), (3, "echo hello > out.txt"), (4, f"echo {MARK}")]
    assert [env.get("PAGER") for _, _, env in sb.ran[:3]] == ["cat"] * 3 and sb.closed  # (then the harness's scan)
    assert not _alive() and "litellm" not in sys.modules


def test_unparseable_replies_end_as_format_error_naming_the_reply():
    r, session, _ = _episode(["no block here", "```bash\nls\n```", "two\n" + block("a") + "\n" + block("b")])
    assert r.status == "format_error" and r.turns == 3 and not r.steps
    assert "RepeatedFormatError" in r.error and "the last: 'two\\n" in r.error
    assert "Expected exactly 1 action, found 2." in r.messages[-1].content  # the scaffold's own message
    assert not _alive()


def test_a_cut_reply_a_tool_call_and_a_lone_surrogate_are_the_scaffolds_to_read():
    from trajforge.schemas.trajectory import FunctionCall, ToolCall

    call = ToolCall(id="c1", function=FunctionCall(name="bash", arguments='{"command": "ls"}'))
    replies = [Turn(Message(role="assistant", content="THOUGHT: first let me"), finish_reason="length"),
               Turn(Message(role="assistant", content=block("echo \ud800x"), tool_calls=[call]), finish_reason="stop"),
               block(f"echo {MARK}")]
    r, session, _ = _episode(replies)
    assert r.status == "ok"
    assert "reached the output token limit (finish_reason=length)" in session.seen[1][-1]["content"]
    stored = [m for m in r.messages if m.role == "assistant"]
    assert stored[0].content == block("echo \ufffdx") and stored[0].tool_calls is None  # as the scaffold sends it back
    assert r.steps[0].command == "echo \ufffdx"


def test_the_episode_budget_stops_the_scaffold_and_its_thread():
    r, _, _ = _episode([block(f"echo {i}") for i in range(5)], max_turns=2)
    assert r.status == "max_turns" and r.turns == 2 and [s.command for s in r.steps] == ["echo 0", "echo 1"]
    assert not _alive()
    r, _, _ = _episode([block("echo 0"), TeacherError("server down")])  # the loop stops first: close() ends it
    assert r.status == "teacher_error" and r.messages[-1].role == "user" and not _alive()


def test_a_killed_command_is_the_scaffolds_exception_text_and_an_infra_failure_propagates():
    sb = FakeSandbox({"sleep 99": (124, "partial")})
    r, session, _ = _episode([block("sleep 99"), block(f"echo {MARK}")], sb=sb)
    assert r.status == "ok" and r.steps[0].timed_out
    obs = session.seen[1][-1]["content"]
    assert "<exception>An error occurred while executing the command: Command 'sleep 99' timed out after 20 seconds" \
        in obs and "<returncode>-1</returncode>" in obs
    with pytest.raises(SandboxError, match="docker went away"):  # infrastructure: retried by the caller
        _episode([block("boom")], sb=FakeSandbox(fail_on="boom"))
    assert not _alive()


def test_every_reference_solution_renders_into_replies_the_scaffold_parses():
    pkg = msa.load()
    commands = ["cat > a.py <<'EOF'\nprint(1)\nEOF", "  ", "printf '```\\n' > b.md\ncat > c.md <<'EOF'\n```py\nx\n```\nEOF",
                "python3 -m pytest -q"]
    calls = msa.render(_env(), commands)
    assert [name for name, _ in calls] == [""] * 4  # three commands (the blank one skipped) and the submit
    parsed = [pkg["parse"](args["content"], action_regex=msa.ACTION_REGEX, format_error_template="{{error}}")
              for _, args in calls]
    assert [p[0]["command"] for p in parsed[:1] + parsed[2:]] == [commands[0], commands[3], msa.SUBMIT]
    wrapped = parsed[1][0]["command"]  # its lines starting with ``` would end the block: carried base64-encoded
    assert wrapped.startswith("printf %s ") and wrapped.endswith(" | base64 -d | bash")
    assert base64.b64decode("".join(wrapped.split()[2:-4])).decode() == commands[2]
    assert subprocess.run(["bash", "-c", wrapped.replace("| bash", "")], capture_output=True, text=True,
                          check=True).stdout == commands[2]  # what the sandbox's bash is given
    session = _ReplaySession(commands)
    session.render_with(lambda cmds: msa.render(_env(), cmds))
    first = asyncio.run(session.next_turn([], []))
    assert first.message.content == calls[0][1]["content"] and first.message.tool_calls is None


def test_a_missing_package_is_a_named_error_saying_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "minisweagent.agents.default", None)
    with pytest.raises(msa.MiniSweAgentMissing, match=r"pip install 'trajforge\[mini-swe-agent\]'"):
        msa.load()



@pytest.mark.docker
def test_a_replay_build_through_the_scaffold_commits_a_passing_row_with_its_calls(tmp_path, docker_client):
    """rollout, verify, calibrate and export on the engine (prepare / execute_shard / commit, no Prefect), one environment
    under the scaffold with the replay teacher: its reference solution passes as the scaffold's replies, and the
    row's recorded calls (one turn per model call) are the rollout's."""
    from helpers import small_config

    from trajforge.schemas.build import BuildRecord
    from trajforge.schemas.config import parse_config
    from trajforge.schemas.export import TrajectoryRow
    from trajforge.schemas.trajectory import Rollout
    from trajforge.schemas.verdict import Verdict
    from trajforge.tasks.calibrate import CalibrateStage
    from trajforge.tasks.engine import Manifest, StageContext
    from trajforge.tasks.envs.families import get_family
    from trajforge.tasks.envs.images import ensure_image
    from trajforge.tasks.export import ExportStage
    from trajforge.tasks.rollout import RolloutStage
    from trajforge.tasks.verify import VerifyStage

    cfg = parse_config(small_config(tmp_path / "runs", dataset="m", **{
        "rollout.samples_per_env": 1, "rollout.harnesses": [NAME]}))
    ctx = StageContext.create(cfg, "b1")
    ctx.store.write_build(BuildRecord(build_id="b1", dataset=cfg.dataset, created_at=""))
    env = get_family("python_bugfix").generate(1, 0)
    # what synthesize's validation sets (tests/test_harnesses.py validates; its checks cost ~35 s here): the image,
    # and the one file the reference solution changes
    env.image, _ = ensure_image(docker_client, "trajforge/base:latest", env, cfg.synthesize.image_aliases,
                                limits=cfg.sandbox)
    env.expected_changes = [posixpath.join(env.workdir, "mathtext.py")]
    root = ctx.store.root
    ctx.store.write_records(posixpath.join(root, "up", "envs.parquet"), EnvSpec, [env])
    up = {"synthesize": Manifest(stage="synthesize", fingerprint="up", build_id="b0", dir="",
                                 parts=[posixpath.join(root, "up", "envs.parquet")], rows=1, rejects=0,
                                 reject_reasons={}, stats={}, components={}, gate={}, created_at="")}

    def run(stage, upstream):
        return run_stage(stage, ctx, upstream)[1]

    rolled = run(RolloutStage(), up)
    [r] = ctx.store.read_records(rolled.parts, Rollout)
    assert (r.harness, r.status, r.tools_json) == (NAME, "ok", "[]"), r.error
    solution = [c for c in env.solution if c.strip()]
    assert [s.command for s in r.steps] == solution + [msa.SUBMIT]
    replies = [m.content for m in r.messages if m.role == "assistant"]
    assert replies == [args["content"] for _, args in msa.render(env, env.solution)]
    assert r.messages[1].content.startswith(f"Please solve this issue: {env.instruction}")
    assert r.turns == len(r.usage) == len(solution) + 1 and [u.turn for u in r.usage] == list(range(1, r.turns + 1))
    verified = run(VerifyStage(), {**up, "rollout": rolled})
    [verdict] = ctx.store.read_records(verified.parts, Verdict)
    assert verdict.rollout_id == r.rollout_id and verdict.passed
    calibrated = run(CalibrateStage(), {**up, "verify": verified})
    exported = run(ExportStage(), {**up, "rollout": rolled, "verify": verified, "calibrate": calibrated})
    [row] = ctx.store.read_records(exported.parts, TrajectoryRow)
    assert (row.rollout_id, row.harness, row.passed) == (r.rollout_id, NAME, True)
    assert json.loads(row.tools_json) == [] and len(row.messages) == len(r.messages) and row.turns == r.turns


def test_each_familys_reference_solution_round_trips_through_the_scaffolds_parser():
    from trajforge.tasks.envs.families import FAMILIES, get_family

    pkg = msa.load()
    for name in sorted(FAMILIES):
        env = get_family(name).generate(1, 0)
        commands = [c.strip() for c in env.solution if c.strip()]
        replies = [args["content"] for _, args in msa.render(env, env.solution)]
        parsed = [pkg["parse"](text, action_regex=msa.ACTION_REGEX, format_error_template="{{error}}")[0]["command"]
                  for text in replies]
        sent = [base64.b64decode("".join(p.split()[2:-4])).decode().strip() if p.endswith("| base64 -d | bash")
                and not c.endswith("| base64 -d | bash") else p for p, c in zip(parsed, commands)]
        assert sent == commands and parsed[-1] == msa.SUBMIT, name
