"""The interactive terminal harness `trajforge-terminal-v1` (tasks/agent/harnesses/terminal.py, issue 44): its replay
rendering, its argument checks and format errors, model strings reaching the sandbox only base64-encoded; against
real Docker: an interactive program (python3 REPL, `less`), a command still running at the next turn, C-c of a
hang, an ended session started again, the terminal gone before the settle; reference solutions replayed through
it passing verification (rollout + verify stages); an image without tmux ending `harness_unavailable`."""

from __future__ import annotations

import asyncio
import json
import posixpath
import time

import pytest
from helpers import small_config

from trajforge.schemas.config import parse_config
from trajforge.schemas.trajectory import HARNESS_NAMES, TERMINAL_HARNESS, FunctionCall, Message, ToolCall
from trajforge.tasks.agent import harnesses
from trajforge.tasks.agent.harness import EpisodeSettings, _State
from trajforge.tasks.agent.harnesses import terminal
from trajforge.tasks.envs.families import get_family
from trajforge.tasks.teachers.base import Turn
from trajforge.tasks.teachers.replay import ReplayTeacher, ReplayTeacherConfig

# the image the Docker tests build environments from: trajforge/base:latest once it has tmux (the lead rebuilds it
# at merge, deploy/images/build-base.sh); until then a side image of it with tmux added from .debs
BASE = "trajforge/base:latest"


def test_the_terminal_harness_is_registered_for_terminal_environments():
    h = harnesses.get(TERMINAL_HARNESS)
    assert TERMINAL_HARNESS in HARNESS_NAMES and h.kinds == ("terminal",) and h.mode is terminal.TerminalMode
    env = get_family("log_report").generate(1, 0)
    assert harnesses.harnesses_for(env, [TERMINAL_HARNESS]) == [TERMINAL_HARNESS]
    assert [t["function"]["name"] for t in terminal.TERMINAL_TOOLS] == ["send_keys", "submit"]


def test_a_reference_solution_renders_as_typed_subshells_that_wait_for_the_prompt():
    env = get_family("shell_script").generate(1, 0)
    calls = terminal.render(env, env.solution)
    assert len(calls) == len([c for c in env.solution if c.strip()])
    for (name, args), command in zip(calls, env.solution):
        assert name == "send_keys" and args["literal"] is True and args["wait_seconds"] >= 600
        assert args["keys"] == [f"(\n{command.strip(chr(10))}\n) </dev/null\n"]
    # a tab (a Makefile's recipe) is typed after C-v: readline inserts it, never completes
    make = env.model_copy(update={"solution": ["cat > Makefile <<'EOF'\nall:\n\techo hi\nEOF", "  "]})
    assert terminal.render(make, make.solution) == [("send_keys", {
        "keys": ["(\ncat > Makefile <<'EOF'\nall:\n\x16\techo hi\nEOF\n) </dev/null\n"], "literal": True,
        "wait_seconds": 3600})]


def test_the_replay_teacher_sends_the_rendered_calls_with_tools_and_fenced():
    env = get_family("python_bugfix").generate(1, 0)
    session = harnesses.bind_rendering(ReplayTeacher(ReplayTeacherConfig(backend="replay")).session(env, 0), env,
                                       TERMINAL_HARNESS)
    first = asyncio.run(session.next_turn([], terminal.TERMINAL_TOOLS)).message.tool_calls[0]
    assert first.function.name == "send_keys" and json.loads(first.function.arguments)["literal"] is True
    fenced = harnesses.bind_rendering(ReplayTeacher(ReplayTeacherConfig(backend="replay")).session(env, 0), env,
                                      TERMINAL_HARNESS)
    text = asyncio.run(fenced.next_turn([], [])).message.content
    assert text.startswith("```json\n") and json.loads(text[8:-4])["tool"] == "send_keys"


def test_a_call_carries_model_strings_only_base64_encoded_and_shows_the_text_typed_as_comments():
    evil = "x'; touch /tmp/pwned; echo '\n$(rm -rf /)\r`id`"
    script = terminal.terminal_script({"keys": [evil, "Enter"], "literal": False, "wait_seconds": 1}, 1, "/w d")
    lines = script.splitlines()
    assert lines[0].startswith("# send_keys {") and json.loads(lines[0][len("# send_keys "):])["keys"] == [evil, "Enter"]
    shown = [line for line in lines if line.startswith("#| ")]
    assert shown == ["#| x'; touch /tmp/pwned; echo '", "#| $(rm -rf /)", "#| `id`"]  # key names are not text
    code = [line for line in lines if not line.startswith("#")]
    assert not any("pwned" in line or "rm -rf" in line or "`id`" in line for line in code)
    assert "-c '/w d'" in script and "send-keys -t agent -- " in script
    assert "send-keys -t agent -l -- " in terminal.terminal_script({"keys": ["a"], "literal": True}, 0, "/w")


class _Ep:
    """What a mode needs of the episode, without a sandbox: a call that gets past the checks fails the test."""

    def __init__(self):
        from trajforge.tasks.agent.harness import _Episode

        self.st = _State([], deadline=time.monotonic() + 60)
        self.s = EpisodeSettings(max_turns=5, command_timeout_s=10, episode_timeout_s=60)
        self.garbled = lambda msg: _Episode.garbled(self, msg)

    async def handle_tool_calls(self, turn, msg, answer):
        from trajforge.tasks.agent.harness import _Episode

        await _Episode.handle_tool_calls(self, turn, msg, answer)


def test_replies_the_harness_cannot_parse_are_format_errors_with_the_reply_never_a_crash():
    env = get_family("log_report").generate(1, 0)
    mode = terminal.TerminalMode(_Ep(), env)

    def call(name, arguments):
        return Message(role="assistant", tool_calls=[ToolCall(id="c", function=FunctionCall(name=name, arguments=arguments))])

    async def go():
        await mode.handle_tool_calls(1, call("send_keys", "{not json"))
        await mode.handle_tool_calls(2, call("send_keys", json.dumps({"keys": [1, 2]})))
        await mode.handle_tool_calls(3, call("send_keys", json.dumps({"keys": ["ls"], "wait_seconds": "soon"})))
        await mode.handle_tool_calls(4, call("bash", json.dumps({"command": "ls"})))
        await mode.handle_text(5, Message(role="assistant", content="I would type ls now."))
        await mode.handle_text(6, Message(role="assistant", content='```json\n{"tool": oops}\n```'))

    asyncio.run(go())
    answers = [m.content for m in mode.st.messages]
    assert answers[0].startswith("format error: arguments are not valid JSON (")
    assert answers[1] == "format error: `keys` must be a list of strings (key names such as Enter, C-c, or text)"
    assert answers[2] == "format error: `wait_seconds` must be a number >= 0"
    assert answers[3] == "format error: use send_keys (keys, wait_seconds) or submit"
    assert answers[4].startswith("format error: no send_keys call found.")
    assert answers[5].startswith("format error: the ```json block is not valid JSON")
    assert mode.st.format_errors == 6 and mode.st.steps == [] and not mode.st.submitted


def test_without_tool_calling_a_json_call_or_a_bash_block_is_typed_and_submit_ends(tmp_path):
    assert parse_config(small_config(tmp_path, **{"rollout.harnesses": [TERMINAL_HARNESS]})).rollout.harnesses == [
        TERMINAL_HARNESS]
    mode = terminal.TerminalMode(_Ep(), get_family("log_report").generate(1, 0))
    sent = []

    async def send(turn, args):
        sent.append(args)
        return "~/work$"

    mode.send = send

    async def go():
        await mode.handle_text(1, Message(role="assistant", content='```json\n{"tool": "send_keys", "arguments": '
                                                                    '{"keys": ["q"], "wait_seconds": 1}}\n```'))
        await mode.handle_text(2, Message(role="assistant", content="Let me look.\n```bash\nls -la\n```"))
        await mode.handle_text(3, Message(role="assistant", content="Done. SUBMIT"))

    asyncio.run(go())
    assert sent == [{"keys": ["q"], "wait_seconds": 1}, {"keys": ["ls -la\n"], "literal": True}]
    assert [m.content for m in mode.st.messages] == ["Screen:\n~/work$"] * 2 and mode.st.submitted


def test_keys_too_large_for_one_call_are_a_named_outcome_nothing_sent():
    mode = terminal.TerminalMode(_Ep(), get_family("log_report").generate(1, 0))
    text = asyncio.run(mode.answer(1, "send_keys", {"keys": ["x" * (60 << 10)], "literal": True}))
    assert text.startswith("[too_large: the keys of one call are at most") and mode.st.format_errors == 0
    (step,) = mode.st.steps
    assert step.exit_code == terminal.OUTCOMES["too_large"] and step.command.endswith(": too_large, nothing sent")


# -- against real Docker ------------------------------------------------------------------------------
class _Scripted:
    """A teacher session that answers each turn with the next scripted `send_keys` call (a str: raw arguments)."""

    def __init__(self, calls):
        self.calls, self.i = list(calls), 0

    async def next_turn(self, messages, tools):
        name, args = self.calls[self.i] if self.i < len(self.calls) else ("submit", {})
        self.i += 1
        call = ToolCall(id=f"c{self.i}", function=FunctionCall(
            name=name, arguments=args if isinstance(args, str) else json.dumps(args)))
        return Turn(Message(role="assistant", tool_calls=[call]), finish_reason="tool_calls")


def _keys(*keys, wait=2.0):
    return "send_keys", {"keys": list(keys), "wait_seconds": wait}


def _episode(docker_client, calls, sandbox=None, **settings):
    from trajforge.schemas.common import FileSpec
    from trajforge.schemas.config import SandboxConfig
    from trajforge.schemas.environment import EnvSpec
    from trajforge.tasks.agent.harness import run_episode
    from trajforge.tasks.envs.images import ensure_image
    from trajforge.tasks.sandbox import Sandbox

    env = EnvSpec(env_id="terminal-edges", family="f", level=1, seed=0, instruction="use the terminal",
                  files=[FileSpec(path="notes.txt", content="".join(f"note {i}\n" for i in range(1, 201)))],
                  tests=[FileSpec(path="test_x.py", content="def test_a(): pass")])
    env.image, _ = ensure_image(docker_client, BASE, env)
    s = EpisodeSettings(**{"max_turns": 30, "command_timeout_s": 15, "episode_timeout_s": 120, **settings})
    make = sandbox or Sandbox
    return asyncio.run(run_episode(env, _Scripted(calls), lambda: make(docker_client, env.image, SandboxConfig(),
                                                                       workdir=env.workdir),
                                   s, "scripted", 0, harness=TERMINAL_HARNESS))


@pytest.mark.docker
def test_the_terminal_runs_interactive_programs_and_commands_that_outlive_a_turn(docker_client):
    r = _episode(docker_client, [
        _keys("python3", "Enter", wait=1.5),                    # 1 a REPL: still in the foreground
        _keys("print(6 * 7)", "Enter", wait=1),                 # 2 typed into it
        _keys("C-d", wait=5),                                   # 3 back at the shell's prompt
        _keys("sleep 4; echo done-sleeping", "Enter", wait=0.3),  # 4 still running at the next turn
        _keys(wait=10),                                         # 5 no keys: wait and look
        _keys("less notes.txt", "Enter", wait=1.5),             # 6 a pager
        _keys("q", wait=5),                                     # 7 quit it
        _keys("sleep 600", "Enter", wait=0.3),                  # 8 a hang
        _keys("C-c", wait=5),                                   # 9 interrupted
        ("send_keys", '{"keys": ["ls"'),                        # 10 unparseable: a format error, nothing sent
        _keys("echo kept > out.txt; cd /tmp; exit", "Enter", wait=2),  # 11 the shell ends its session
        _keys("pwd; echo $HISTFILE.", "Enter"),                 # 12 a new one, in the work dir
        _keys("sleep 900", "Enter", wait=0.2),                  # 13 still running at submit
    ])
    assert r.status == "ok" and r.harness == TERMINAL_HARNESS, (r.status, r.error)
    screens = [m.content for m in r.messages if m.role == "tool"]
    assert screens[0].startswith("[still running after 1.5 s: python3 in the foreground")
    assert screens[0].rstrip().endswith(">>>")
    assert "\n42\n>>>" in screens[1]
    assert screens[2].splitlines()[-1].endswith("$") and not screens[2].startswith("[")
    assert screens[3].startswith("[still running after 0.3 s: sleep in the foreground") and "done-sleeping\n" not in screens[3]
    assert "\ndone-sleeping\n" in screens[4] and not screens[4].startswith("[")
    assert screens[5].startswith("[still running after 1.5 s: less") and "note 1\n" in screens[5] and "note 120" not in screens[5]
    assert not screens[6].startswith("[") and screens[6].splitlines()[-1].endswith("$")
    assert screens[7].startswith("[still running after 0.3 s: sleep")
    assert "^C" in screens[8] and not screens[8].startswith("[")
    assert screens[9].startswith("format error: arguments are not valid JSON")
    assert screens[10].strip() == "[the terminal session ended (its shell exited); the next call starts a new one]"
    assert screens[11].startswith("[the terminal session had ended; a new one was started]")
    from trajforge.schemas.environment import EnvSpec

    assert f"\n{EnvSpec.model_fields['workdir'].default}\n.\n" in screens[11]  # in the work dir again, no history file
    assert screens[12].startswith("[still running after 0.2 s: sleep")
    # one step per call that reached the terminal (not the format error), its exit code the outcome
    assert [s.exit_code for s in r.steps] == [124, 124, 0, 124, 0, 124, 0, 124, 0, 0, 0, 124]
    assert [s.timed_out for s in r.steps] == [s.exit_code == 124 for s in r.steps]
    assert all(s.killed_by is None and s.command.startswith("# send_keys {") for s in r.steps)
    # the terminal (and the sleep it ran) is gone before the settle: no leftover process; the file is captured
    assert r.leftover_processes == 0 and r.final_state is not None
    import io
    import tarfile

    names = {m.name.split("/", 1)[-1]: m for m in tarfile.open(fileobj=io.BytesIO(r.final_state)).getmembers()}
    assert "out.txt" in names and not [n for n in names if "tmux" in n]
    assert not [c for c in (r.changes.added if r.changes else []) if "tmux" in c], r.changes


@pytest.mark.docker
def test_an_image_without_tmux_ends_the_episode_harness_unavailable(docker_client):
    from trajforge.tasks.sandbox import Sandbox

    class NoTmux(Sandbox):  # the base image (with tmux, or soon with it) made into one without
        def start(self):
            super().start()
            self.exec("rm -f /usr/bin/tmux", 30, user="root")

    r = _episode(docker_client, [_keys("ls", "Enter")], sandbox=NoTmux)
    assert r.status == "harness_unavailable" and r.turns == 0 and r.steps == []
    assert "needs tmux" in r.error and [m.role for m in r.messages] == ["system", "user"]


@pytest.mark.docker
def test_reference_solutions_replayed_through_the_terminal_pass_verification(tmp_path, docker_client):
    """rollout + verify on the engine with the replay teacher: the reference solution typed into the terminal
    passes the hidden tests (verified isolated, as a build does)."""
    from trajforge.schemas.build import BuildRecord
    from trajforge.schemas.environment import EnvSpec
    from trajforge.schemas.trajectory import Rollout
    from trajforge.schemas.verdict import Verdict
    from trajforge.tasks.engine import Manifest, StageContext, commit, execute_shard, prepare
    from trajforge.tasks.envs.audit import AuditSettings
    from trajforge.tasks.envs.validator import validate_env
    from trajforge.tasks.rollout import RolloutStage
    from trajforge.tasks.verify import VerifyStage

    cfg = parse_config(small_config(tmp_path / "runs", dataset="t", **{
        "rollout.samples_per_env": 1, "rollout.harnesses": [TERMINAL_HARNESS], "sandbox.base_image": BASE}))
    ctx = StageContext.create(cfg, "b1")
    ctx.store.write_build(BuildRecord(build_id="b1", dataset=cfg.dataset, created_at=""))
    envs = [get_family("shell_script").generate(1, 0)]  # a heredoc writing a script, then chmod
    for e in envs:  # validated as synthesize validates them (what the reference changes is what verify expects)
        v = validate_env(docker_client, e, cfg.sandbox, BASE, cfg.synthesize.image_aliases, 30, 30,
                         audit=AuditSettings(mode="off"))
        assert v.ok, v.reject
    root = ctx.store.root
    ctx.store.write_records(posixpath.join(root, "up", "envs.parquet"), EnvSpec, envs)
    up = {"synthesize": Manifest(stage="synthesize", fingerprint="up", build_id="b0", dir="",
                                 parts=[posixpath.join(root, "up", "envs.parquet")], rows=1, rejects=0,
                                 reject_reasons={}, stats={}, components={}, gate={}, created_at="")}

    def run(stage, upstream):
        plan = prepare(stage, ctx, upstream)
        for shard in plan.pending:
            execute_shard(stage, ctx, plan.dir, shard, upstream)
        return commit(stage, ctx, plan, upstream)

    rolled = run(RolloutStage(), up)
    rows = ctx.store.read_records(rolled.parts, Rollout)
    assert [(r.harness, r.status) for r in rows] == [(TERMINAL_HARNESS, "ok")], [(r.status, r.error) for r in rows]
    for r in rows:
        assert {c.function.name for m in r.messages if m.tool_calls for c in m.tool_calls} == {"send_keys", "submit"}
        assert [s.exit_code for s in r.steps] == [0] * len(envs[0].solution) and r.leftover_processes == 0
    verdicts = ctx.store.read_records(run(VerifyStage(), {**up, "rollout": rolled}).parts, Verdict)
    assert len(verdicts) == 1 and all(v.passed for v in verdicts), [(v.rollout_id, v.passed) for v in verdicts]
