"""The harness registry (tasks/agent/harnesses, issue 44): the built-ins, `rollout.harnesses` and its named
error, rollout ids per (env, teacher, harness, sample), the SWE harness's replay rendering; against real
Docker: the `str_replace_editor` edge cases in a real sandbox, and a toy harness registered here followed with
the bash and SWE harnesses through a small replay build (rollout + verify stages on the engine)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import posixpath
from pathlib import Path

import pytest
from helpers import run_stage, small_config
from pydantic import ValidationError

from trajforge.schemas.config import ConfigError, RolloutConfig, parse_config
from trajforge.schemas.trajectory import (
    BASH_HARNESS,
    HARNESS_NAMES,
    SWE_HARNESS,
    TERMINAL_HARNESS,
    TOOLS_HARNESS,
    Message,
)
from trajforge.tasks.agent import harnesses
from trajforge.tasks.agent.harness import MODES, rollout_id
from trajforge.tasks.agent.harnesses import swe
from trajforge.tasks.envs.families import get_family
from trajforge.tasks.teachers.replay import ReplayTeacher, ReplayTeacherConfig

TOY = "toy-echo-v1"


def test_the_built_in_harnesses_are_registered_and_an_unknown_name_is_named():
    assert {BASH_HARNESS, TOOLS_HARNESS, SWE_HARNESS} <= set(harnesses.HARNESSES) <= HARNESS_NAMES
    assert harnesses.get(BASH_HARNESS).mode is MODES["bash"] and harnesses.get(TOOLS_HARNESS).mode is MODES["mcp"]
    with pytest.raises(KeyError, match="unknown harness 'tmux'; registered: mini-swe-agent, trajforge-bash-v1, trajforge-mcp-v1"):
        harnesses.get("tmux")


def test_an_unknown_harness_in_the_config_is_a_validation_error_listing_the_registered(tmp_path):
    assert parse_config(small_config(tmp_path)).rollout.harnesses == [BASH_HARNESS]
    with pytest.raises(ConfigError) as err:
        parse_config(small_config(tmp_path, **{"rollout.harnesses": [BASH_HARNESS, "tmux"]}))
    text = str(err.value)
    assert "rollout.harnesses: Value error, unknown harness 'tmux'" in text
    assert f"registered: mini-swe-agent, {BASH_HARNESS}, {TOOLS_HARNESS}, {SWE_HARNESS}" in text
    with pytest.raises(ValidationError, match="unknown harness 'tmux'"):  # the pydantic error under it
        RolloutConfig(harnesses=["tmux"])


def test_an_environment_runs_under_the_listed_harnesses_of_its_kind_else_its_kinds_own():
    terminal, tools = get_family("log_report").generate(1, 0), get_family("bookings").generate(1, 0)
    both = [SWE_HARNESS, BASH_HARNESS]
    assert harnesses.harnesses_for(terminal, both) == both
    assert harnesses.harnesses_for(tools, both) == [TOOLS_HARNESS]
    assert harnesses.harnesses_for(terminal, None) == [BASH_HARNESS]
    # the kind's own harness keeps the rollout ids of before; another one is a distinct episode
    assert harnesses.episode_harness(terminal, BASH_HARNESS) is None
    old = rollout_id(terminal.env_id, "replay", 0)
    assert old == hashlib.sha256(f"{terminal.env_id}|replay|0".encode()).hexdigest()[:16]  # the formula of before
    assert old == rollout_id(terminal.env_id, "replay", 0, harnesses.episode_harness(terminal, BASH_HARNESS))
    assert old != rollout_id(terminal.env_id, "replay", 0, harnesses.episode_harness(terminal, SWE_HARNESS))


def test_the_swe_harness_renders_reference_solutions_into_editor_calls_and_bash():
    script = get_family("shell_script").generate(1, 0)
    (create, chmod) = swe.render(script, script.solution)
    assert create[0] == "str_replace_editor" and create[1]["command"] == "create"
    assert create[1]["path"].startswith(script.workdir + "/") and create[1]["file_text"].startswith("#!/usr/bin/env bash")
    assert chmod[0] == "bash" and chmod[1]["command"].startswith("chmod +x")
    bugfix = get_family("python_bugfix").generate(1, 0)
    calls = swe.render(bugfix, bugfix.solution)
    assert calls and all(name == "str_replace_editor" and args["command"] == "str_replace" for name, args in calls)
    report = get_family("log_report").generate(1, 0)  # a computing script stays a bash call
    assert swe.render(report, report.solution) == [("bash", {"command": report.solution[0]})]
    # a file the renderer knows is replaced whole, and an unquoted heredoc (the shell expands it) stays bash
    known = bugfix.model_copy(update={"solution": ["cat > mathtext.py <<'EOF'\nx = 1\nEOF", "cat > b <<EOF\n$x\nEOF"]})
    (edit, raw) = swe.render(known, known.solution)
    assert edit[1]["command"] == "str_replace" and edit[1]["old_str"] == bugfix.files[0].content
    assert raw == ("bash", {"command": "cat > b <<EOF\n$x\nEOF"})


def test_the_replay_teacher_replays_the_rendered_calls_with_tools_and_fenced():
    env = get_family("shell_script").generate(1, 0)
    session = harnesses.bind_rendering(ReplayTeacher(ReplayTeacherConfig(backend="replay")).session(env, 0), env,
                                       SWE_HARNESS)
    first = asyncio.run(session.next_turn([], swe.SWE_TOOLS)).message.tool_calls[0].function
    assert first.name == "str_replace_editor" and json.loads(first.arguments)["command"] == "create"
    fenced = harnesses.bind_rendering(ReplayTeacher(ReplayTeacherConfig(backend="replay")).session(env, 0), env,
                                      SWE_HARNESS)
    texts = [asyncio.run(fenced.next_turn([], [])).message.content for _ in range(3)]
    assert texts[0].startswith("```json\n") and json.loads(texts[0][8:-4])["tool"] == "str_replace_editor"
    assert texts[1] == "```bash\nchmod +x " + texts[1].split("chmod +x ")[1] and texts[2] == "SUBMIT"
    plain = harnesses.bind_rendering(ReplayTeacher(ReplayTeacherConfig(backend="replay")).session(env, 0), env,
                                     BASH_HARNESS)  # the kind's own: nothing rendered, as always
    assert plain.calls is None


def test_editor_arguments_that_do_not_fit_are_the_scaffolds_texts():
    assert swe.invalid({"command": "delete", "path": "/x"}) == (
        "Unrecognized command delete. The allowed commands for the str_replace_editor tool are: view, create, "
        "str_replace, insert, undo_edit")
    assert swe.invalid({"command": "str_replace", "path": "/x"}) == (
        "Parameter `old_str` is required for command: str_replace")
    assert swe.invalid({"command": "insert", "path": "/x", "new_str": "a", "insert_line": "3"}) == (
        "Parameter `insert_line` must be an integer")
    assert swe.invalid({"command": "view", "path": "/x", "view_range": [1, 2]}) is None


def test_an_editor_command_carries_model_strings_only_base64_encoded():
    """Whatever the model sends, the shell command is the fixed program + base64 argv: nothing to inject."""
    nasty = {"path": "/w/$(touch /tmp/pwned)`id`", "old_str": "'; rm -rf / #\n" + swe.TAG + "\necho", "root": "/w"}
    shell = swe.editor_command("str_replace", nasty)
    comment, head, program = shell.split("\n", 2)
    assert comment == '# str_replace_editor str_replace "/w/$(touch /tmp/pwned)`id`"'  # one line: a shell skips it
    assert "\n" not in swe.editor_command("view", {"path": "/w/a\nb\u2028c"}).split("\npython3")[0]
    assert head.startswith("python3 -I - str_replace_editor str_replace ") and head.endswith(f"<<'{swe.TAG}'")
    argv = head.removeprefix("python3 -I - str_replace_editor str_replace ").removesuffix(f" <<'{swe.TAG}'")
    assert argv and all(c.isalnum() or c in "+/= " for c in argv)
    assert program == swe.PROGRAM + "\n" + swe.TAG


# -- against a real sandbox -----------------------------------------------------------------------------

class _Scripted:
    """A teacher session that sends the given tool calls, one per turn, then `submit`."""

    def __init__(self, calls: list[tuple[str, dict]]):
        self.calls, self.i = calls, 0

    async def next_turn(self, messages, tools):
        from trajforge.schemas.trajectory import FunctionCall, ToolCall
        from trajforge.tasks.teachers.base import Turn

        name, args = self.calls[self.i] if self.i < len(self.calls) else ("submit", {})
        self.i += 1
        call = ToolCall(id=f"c{self.i}", function=FunctionCall(name=name, arguments=json.dumps(args)))
        return Turn(Message(role="assistant", tool_calls=[call]), completion_tokens=5, finish_reason="tool_calls")


def _edit(**args) -> tuple[str, dict]:
    return "str_replace_editor", args


@pytest.mark.docker
def test_the_editor_in_a_real_sandbox_names_each_edge_case(docker_client):
    from trajforge.schemas.common import FileSpec
    from trajforge.schemas.config import SandboxConfig
    from trajforge.schemas.environment import EnvSpec
    from trajforge.tasks.agent.harness import EpisodeSettings, run_episode
    from trajforge.tasks.envs.images import ensure_image
    from trajforge.tasks.sandbox import Sandbox

    long = "".join(f"line {i}\n" for i in range(1, 401))
    env = EnvSpec(env_id="editor-edges", family="f", level=1, seed=0, instruction="edit",
                  files=[FileSpec(path="a.py", content="x = 1\ny = 1\nz = 2\n"), FileSpec(path="long.txt", content=long),
                         FileSpec(path="pkg/mod.py", content="pass\n")],
                  tests=[FileSpec(path="test_x.py", content="def test_a(): pass")])
    env.image, _ = ensure_image(docker_client, "trajforge/base:latest", env)
    w = env.workdir
    calls = [
        ("bash", {"command": "printf 'a\\000b' > blob.bin && mkfifo pipe && ln -s /etc/passwd escape && mkdir .hid && touch $'bad\\xff'"}),
        _edit(command="str_replace", path=f"{w}/a.py", old_str="= 1", new_str="= 3"),              # 2 not unique
        _edit(command="str_replace", path=f"{w}/a.py", old_str="w = 9", new_str="w = 0"),          # 3 no match
        _edit(command="str_replace", path=f"{w}/a.py", old_str="y = 1", new_str="y = 10"),         # 4 ok
        _edit(command="view", path=f"{w}/nope.py"),                                               # 5 missing
        _edit(command="undo_edit", path=f"{w}/a.py"),                                             # 6 undone
        _edit(command="undo_edit", path=f"{w}/a.py"),                                             # 7 no history
        _edit(command="view", path=f"{w}/long.txt", view_range=[198, 201]),                       # 8 by range
        _edit(command="view", path=f"{w}/long.txt", view_range=[390, 999]),                       # 9 bad range
        _edit(command="view", path=f"{w}/blob.bin"),                                              # 10 binary
        _edit(command="view", path="/etc/passwd"),                                                # 11 outside
        _edit(command="view", path=f"{w}/escape"),                                                # 12 link out
        _edit(command="create", path="/tmp/x.py", file_text="x"),                                 # 13 outside
        _edit(command="view", path=f"{w}/pipe"),                                                  # 14 a FIFO
        _edit(command="view", path=w),                                                            # 15 folder
        _edit(command="create", path=f"{w}/new/b.py", file_text="b = 1\n"),                       # 16 created
        _edit(command="create", path=f"{w}/new/b.py", file_text="b = 2\n"),                       # 17 exists
        _edit(command="insert", path=f"{w}/new/b.py", insert_line=1, new_str="c = 2"),            # 18 inserted
        _edit(command="undo_edit", path=f"{w}/new/b.py"),                                         # 19 undo insert
        _edit(command="undo_edit", path=f"{w}/new/b.py"),                                         # 20 undo create
        _edit(command="view", path="relative.py"),                                                # 21 not absolute
        _edit(command="str_replace", path=f"{w}/a.py"),                                           # 22 no old_str
    ]
    s = EpisodeSettings(max_turns=len(calls) + 1, command_timeout_s=20, episode_timeout_s=300)
    r = asyncio.run(run_episode(env, _Scripted(calls), lambda: Sandbox(docker_client, env.image, SandboxConfig(),
                                                                       workdir=w), s, "t", 0, harness=SWE_HARNESS))
    assert r.status == "ok" and r.harness == SWE_HARNESS, (r.status, r.error)
    assert json.loads(r.tools_json) == swe.SWE_TOOLS
    seen = {m.tool_call_id: m.content for m in r.messages if m.role == "tool"}
    out = [seen[f"c{i}"] for i in range(1, len(calls) + 1)]
    assert out[1] == ("No replacement was performed. Multiple occurrences of old_str `= 1` in lines [1, 2]. "
                      "Please ensure it is unique")
    assert out[2] == f"No replacement was performed, old_str `w = 9` did not appear verbatim in {w}/a.py."
    assert out[3].startswith(f"The file {w}/a.py has been edited. Here's the result of running `cat -n` on a "
                             f"snippet of {w}/a.py:\n     1\tx = 1\n     2\ty = 10\n")
    assert out[4] == f"The path {w}/nope.py does not exist. Please provide a valid path."
    assert out[5].startswith(f"Last edit to {w}/a.py undone successfully. ") and "     2\ty = 1\n" in out[5]
    assert out[6] == f"No edit history found for {w}/a.py."
    assert out[7] == (f"Here's the result of running `cat -n` on {w}/long.txt:\n"
                      "   198\tline 198\n   199\tline 199\n   200\tline 200\n   201\tline 201\n")
    assert out[8].startswith("Invalid `view_range`: [390, 999]. Its second element `999` should be smaller than")
    assert "is a binary file" in out[9]
    assert all("is outside" in out[i] for i in (10, 11, 12)), out[10:13]
    assert "not a regular file" in out[13]
    assert out[14].startswith(f"Here's the files and directories up to 2 levels deep in {w}, excluding hidden items:")
    assert f"{w}/pkg/mod.py" in out[14] and ".hid" not in out[14] and f"{w}/bad\\udcff" in out[14]  # not UTF-8
    assert out[15] == f"File created successfully at: {w}/new/b.py"
    assert out[16] == f"File already exists at: {w}/new/b.py. Cannot overwrite files using command `create`."
    assert out[17].startswith(f"The file {w}/new/b.py has been edited.") and "     2\tc = 2\n" in out[17]
    assert "     1\tb = 1\n" in out[18] and "c = 2" not in out[18]
    assert out[19] == f"Last edit to {w}/new/b.py undone successfully. The file no longer exists."
    assert out[20].startswith("The path relative.py is not an absolute path, it should start with `/`.")
    assert out[21] == "Parameter `old_str` is required for command: str_replace"
    codes = [st.exit_code for st in r.steps]
    named = {v: k for k, v in swe.OUTCOMES.items()}
    assert [named.get(c) for c in codes[1:]] == [
        "not_unique", "no_match", "ok", "missing_path", "ok", "no_history", "ok", "invalid_range", "binary",
        "outside", "outside", "outside", "not_regular", "ok", "ok", "exists", "ok", "ok", "ok", "invalid_arguments"]
    assert r.steps[1].command.startswith(f'# str_replace_editor str_replace "{w}/a.py"\npython3 -I - str_replace_editor ')
    # an undo with no history ran nothing, and its step replays as nothing (a sibling replay re-runs steps)
    assert r.steps[6].command == f'# str_replace_editor undo_edit "{w}/a.py"\n: no_history, answered without running'
    # the final work dir: a.py as it was, new/ without b.py (its creation undone)
    import io
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(r.final_state)) as tar:
        names = {posixpath.normpath(m.name) for m in tar.getmembers()}
        a = tar.extractfile(next(m for m in tar.getmembers() if m.name.endswith("a.py"))).read()
    assert a == b"x = 1\ny = 1\nz = 2\n" and not any(n.endswith("new/b.py") for n in names)


@pytest.fixture
def toy_harness():
    """A fifth harness registered from a test: bash under another name, its tool called `sh`, a reference
    command replayed as an `sh` call."""
    from trajforge.tasks.agent.harness import TOOLS

    class _Mode:
        what = "command"

        def __init__(self, ep, env):
            self.ep = ep

        async def offered(self):
            return [{"type": "function", "function": {**TOOLS[0]["function"], "name": "sh"}}, TOOLS[1]]

        def system_prompt(self, env):
            return f"Toy harness: call `sh`, then `submit`. Work dir {env.workdir}."

        async def answer(self, turn, name, args):
            return await self.ep.answer(turn, "bash" if name == "sh" else name, args)

        async def handle_tool_calls(self, turn, msg):
            await self.ep.handle_tool_calls(turn, msg, self.answer)

        async def handle_text(self, turn, msg, cut=False):
            await self.ep.handle_text(turn, msg, cut)

    h = harnesses.register(harnesses.Harness(name=TOY, kinds=("terminal",), mode=_Mode,
                                             render=lambda env, commands: [("sh", {"command": c}) for c in commands]))
    yield h
    harnesses.HARNESSES.pop(TOY)
    HARNESS_NAMES.discard(TOY)


@pytest.mark.docker
def test_a_toy_harness_and_the_swe_harness_through_a_small_replay_build(tmp_path, docker_client, toy_harness):
    """rollout, verify, calibrate and export on the engine (prepare / execute_shard / commit, gates included, no
    Prefect): 2 environments x 3 harnesses with the replay teacher: every reference solution passes under every
    harness, rows say which harness made them, the kind's own keeps its rollout ids, a rerun of the rollout stage
    is reused, and the exported rows keep each harness's tools."""
    from trajforge.schemas.build import BuildRecord
    from trajforge.schemas.calibration import Calibration
    from trajforge.schemas.environment import EnvSpec
    from trajforge.schemas.export import TrajectoryRow
    from trajforge.schemas.trajectory import Rollout
    from trajforge.schemas.verdict import Verdict
    from trajforge.tasks.calibrate import CalibrateStage
    from trajforge.tasks.engine import Manifest, StageContext
    from trajforge.tasks.envs.audit import AuditSettings
    from trajforge.tasks.envs.validator import validate_env
    from trajforge.tasks.export import ExportStage
    from trajforge.tasks.rollout import RolloutStage
    from trajforge.tasks.verify import VerifyStage

    cfg = parse_config(small_config(tmp_path / "runs", dataset="h", **{
        "rollout.samples_per_env": 1, "rollout.harnesses": [BASH_HARNESS, SWE_HARNESS, TOY]}))
    ctx = StageContext.create(cfg, "b1")
    ctx.store.write_build(BuildRecord(build_id="b1", dataset=cfg.dataset, created_at=""))
    envs = [get_family(n).generate(1, 0) for n in ("python_bugfix", "shell_script")]
    for e in envs:  # validated as synthesize validates them (what the reference changes is what verify expects)
        v = validate_env(docker_client, e, cfg.sandbox, "trajforge/base:latest", cfg.synthesize.image_aliases, 30, 30,
                         audit=AuditSettings(mode="off"))
        assert v.ok, v.reject
    root = ctx.store.root
    ctx.store.write_records(posixpath.join(root, "up", "envs.parquet"), EnvSpec, envs)
    up = {"synthesize": Manifest(stage="synthesize", fingerprint="up", build_id="b0", dir="",
                                 parts=[posixpath.join(root, "up", "envs.parquet")], rows=2, rejects=0,
                                 reject_reasons={}, stats={}, components={}, gate={}, created_at="")}

    def run(stage, upstream):
        return run_stage(stage, ctx, upstream)[1]

    rolled = run(RolloutStage(), up)
    rows = ctx.store.read_records(rolled.parts, Rollout)
    assert sorted((r.env_id, r.harness) for r in rows) == sorted((e.env_id, h) for e in envs
                                                                 for h in (BASH_HARNESS, SWE_HARNESS, TOY))
    assert {r.status for r in rows} == {"ok"}, [(r.harness, r.status, r.error) for r in rows]
    assert len({r.rollout_id for r in rows}) == 6 and rolled.stats["harnesses"] == {
        BASH_HARNESS: 2, SWE_HARNESS: 2, TOY: 2}
    for r in rows:
        mine = None if r.harness == BASH_HARNESS else r.harness
        assert r.rollout_id == rollout_id(r.env_id, "replay", 0, mine)
        names = [c.function.name for m in r.messages if m.tool_calls for c in m.tool_calls]
        assert names[-1] == "submit" and set(names[:-1]) <= {BASH_HARNESS: {"bash"}, TOY: {"sh"},
                                                            SWE_HARNESS: {"bash", "str_replace_editor"}}[r.harness]
    swe_bugfix = next(r for r in rows if r.harness == SWE_HARNESS and r.env_id == envs[0].env_id)
    assert [c.function.name for m in swe_bugfix.messages if m.tool_calls for c in m.tool_calls][0] == "str_replace_editor"
    verified = run(VerifyStage(), {**up, "rollout": rolled})
    verdicts = ctx.store.read_records(verified.parts, Verdict)
    assert len(verdicts) == 6 and all(v.passed for v in verdicts), [(v.rollout_id, v.passed) for v in verdicts]
    assert run(RolloutStage(), up).fingerprint == rolled.fingerprint  # committed: reused, not run again
    # calibration per (environment, teacher, harness): None stands for the kind's own harness
    calibrated = run(CalibrateStage(), {**up, "verify": verified})
    pairs = sorted((c.env_id, c.harness or "", c.attempts, c.passes, c.label)
                   for c in ctx.store.read_records(calibrated.parts, Calibration))
    assert pairs == sorted((e.env_id, h, 1, 1, "trivial") for e in envs for h in ("", SWE_HARNESS, TOY))
    exported = run(ExportStage(), {**up, "rollout": rolled, "verify": verified, "calibrate": calibrated})
    rows = ctx.store.read_records(exported.parts, TrajectoryRow)
    assert sorted(r.harness for r in rows) == sorted([BASH_HARNESS, SWE_HARNESS, TOY] * 2)
    assert {r.difficulty for r in rows} == {"trivial"}  # each row joined to its own pair's label
    swe_row = next(r for r in rows if r.harness == SWE_HARNESS)
    assert [t["function"]["name"] for t in json.loads(swe_row.tools_json)] == ["bash", "str_replace_editor", "submit"]
    # the card compares the harnesses: one row per (teacher, harness), every reference solution a pass
    card = ctx.store.read_text(posixpath.join(exported.dir, "README.md"))
    table = card.split("## Harnesses compared", 1)[1].split("\n## ", 1)[0]
    got = {c[1].strip("` "): c for c in (line.split("|")[1:-1] for line in table.splitlines()
                                          if line.startswith("| `replay"))}
    assert sorted(got) == sorted([BASH_HARNESS, SWE_HARNESS, TOY]), table
    assert all(c[2].strip() == "2" and c[3].strip() == "1.0" for c in got.values()), table


def test_the_judge_labels_editor_steps_by_their_command():
    """A view inspects (or verifies what an earlier step wrote); create / str_replace / insert / undo act, whatever
    the program's text holds (it writes files in every call's step)."""
    from trajforge.schemas.trajectory import Step
    from trajforge.tasks.judge.quality import label_steps

    def step(command, **args):
        return Step(turn=1, command=swe.editor_command(command, {"path": "/w/a.py", "root": "/w", **args}),
                    exit_code=0, duration_s=0.1)

    assert label_steps([step("view"), step("str_replace", old_str="a", new_str="b"), step("view"),
                        Step(turn=2, command="python3 a.py", exit_code=0, duration_s=0.1)]) == [
        "inspect", "act", "verify", "verify"]


@pytest.mark.docker
def test_the_swe_harness_without_tool_calling_replays_fenced_blocks(docker_client):
    """A model without tool calling: one ```json editor call or one ```bash block per turn, then SUBMIT."""
    from trajforge.schemas.config import SandboxConfig
    from trajforge.tasks.agent.harness import EpisodeSettings, run_episode
    from trajforge.tasks.envs.images import ensure_image
    from trajforge.tasks.sandbox import Sandbox

    env = get_family("shell_script").generate(1, 0)
    env.image, _ = ensure_image(docker_client, "trajforge/base:latest", env)
    session = harnesses.bind_rendering(ReplayTeacher(ReplayTeacherConfig(backend="replay")).session(env, 0), env,
                                       SWE_HARNESS)
    s = EpisodeSettings(max_turns=5, command_timeout_s=20, episode_timeout_s=120, tool_calling=False)
    r = asyncio.run(run_episode(env, session, lambda: Sandbox(docker_client, env.image, SandboxConfig(),
                                                              workdir=env.workdir), s, "replay", 0, harness=SWE_HARNESS))
    assert r.status == "ok" and r.tools_json == "[]" and "```json fenced block" in r.messages[0].content
    users = [m.content for m in r.messages[2:] if m.role == "user"]
    assert users[0].startswith("Result of str_replace_editor:\nFile created successfully at: ")
    assert users[1] == "Output:\n[exit code 0]" and [st.exit_code for st in r.steps] == [0, 0]


def test_what_the_sandbox_answers_for_an_edit_is_data_never_a_crash():
    """The editor program runs as the agent, so its output is the agent's to forge (a `python3` of its own): an
    answer that is not the program's is an `editor failed` observation with the step's exit code, never an error
    of the episode."""
    from types import SimpleNamespace

    from trajforge.tasks.agent.harness import EpisodeSettings, _State
    from trajforge.tasks.sandbox import ExecResult

    outputs = iter(['{"outcome": "ok", "text": 123, "old": null}', '{"outcome": "ok", "text": "\\ud800"}',
                    '{"outcome": "ok", "text": "fine", "old": "not base64!"}', "no json at all"])

    class _Box:
        def exec(self, command, timeout_s, output_limit=None):
            return ExecResult(0, next(outputs), 0.01, False, 10, False)

    ep = SimpleNamespace(sb=_Box(), st=_State([], deadline=1e12), s=EpisodeSettings(1, 5, 30), started=None)
    mode = swe.EditorMode(ep, get_family("log_report").generate(1, 0))

    async def calls():
        ep.started = asyncio.get_running_loop().create_future()
        ep.started.set_result(None)  # the container is up
        return [await mode.edit(1, {"command": "view", "path": "/home/agent/work/a"}) for _ in range(4)]

    texts = asyncio.run(calls())
    assert all(t.startswith("[editor failed: exit code 0]") for t in texts), texts
    assert len(ep.st.steps) == 4 and mode.history == {}


def test_calibration_is_per_environment_teacher_and_harness_and_adaptive_rounds_keep_the_harness(tmp_path):
    """Verdicts of one environment under the bash harness (its kind's own) and the SWE harness: two pairs, each its
    own label; an adaptive round asks for the unsure pair only, and the rollout stage plans it under its harness."""
    from trajforge.schemas.build import BuildRecord
    from trajforge.schemas.calibration import Calibration, RoundPlan
    from trajforge.schemas.environment import EnvSpec
    from trajforge.schemas.verdict import Verdict
    from trajforge.tasks.calibrate import CalibrateStage
    from trajforge.tasks.engine import Manifest, StageContext
    from trajforge.tasks.rollout import RolloutStage

    cfg = parse_config(small_config(tmp_path / "runs", dataset="cal", **{
        "rollout.samples_per_env": 4, "rollout.harnesses": [BASH_HARNESS, SWE_HARNESS],
        "calibrate.adaptive": {"batch": 2, "max_samples": 8}}))
    ctx = StageContext.create(cfg, "b1")
    ctx.store.write_build(BuildRecord(build_id="b1", dataset=cfg.dataset, created_at=""))
    env = get_family("log_report").generate(1, 0)
    wins = {BASH_HARNESS: 4, SWE_HARNESS: 2}  # bash: 4 of 4 (sure); swe: 2 of 4 (unsure)
    verdicts = [Verdict(rollout_id=f"{h}-{k}", env_id=env.env_id, teacher="replay", sample=k, status="ok", harness=h,
                        verified=True, passed=k < wins[h], tests_passed=k < wins[h]) for h in wins for k in range(4)]
    root = ctx.store.root
    ctx.store.write_records(posixpath.join(root, "up", "envs.parquet"), EnvSpec, [env])
    ctx.store.write_records(posixpath.join(root, "up", "verdicts.parquet"), Verdict, verdicts)
    up = {s: Manifest(stage=s, fingerprint="up", build_id="b0", dir="", parts=[posixpath.join(root, "up", f)],
                      rows=0, rejects=0, reject_reasons={}, stats={}, components={}, gate={}, created_at="")
          for s, f in (("synthesize", "envs.parquet"), ("verify", "verdicts.parquet"))}
    stage = CalibrateStage()
    _, m = run_stage(stage, ctx, up)
    rows = {c.harness: c for c in ctx.store.read_records(m.parts, Calibration)}
    assert set(rows) == {None, SWE_HARNESS}
    assert (rows[None].passes, rows[SWE_HARNESS].passes) == (4, 2) and rows[SWE_HARNESS].label != rows[None].label
    rounds = RoundPlan.of(m.stats)  # each unsure pair named with its harness (here both: 4 samples say little)
    assert list(zip(rounds.unsure_teachers[env.env_id], rounds.unsure_harnesses[env.env_id])) == [
        ("replay", None), ("replay", SWE_HARNESS)]
    shards = RolloutStage().plan(ctx, {"synthesize": up["synthesize"], "calibrate": m})
    assert [w for s in shards for w in s.payload["episodes"]] == [
        [env.env_id, 4, 0], [env.env_id, 4, 0, SWE_HARNESS], [env.env_id, 5, 0], [env.env_id, 5, 0, SWE_HARNESS]]
    rounds.unsure_teachers, rounds.unsure_harnesses = {env.env_id: ["replay"]}, {env.env_id: [SWE_HARNESS]}
    only = Manifest(**{**m.model_dump(), "stats": {**m.stats, RoundPlan.STATS_KEY: rounds.model_dump(mode="json")}})
    shards = RolloutStage().plan(ctx, {"synthesize": up["synthesize"], "calibrate": only})
    assert [w for s in shards for w in s.payload["episodes"]] == [[env.env_id, 4, 0, SWE_HARNESS],
                                                                   [env.env_id, 5, 0, SWE_HARNESS]]


def test_the_report_compares_harnesses_only_when_a_build_ran_more_than_one():
    """The report's per-(teacher, harness) table: solve rate over the episodes not lost to infrastructure, mean
    turns and tokens; a build of one harness shows no table."""
    from trajforge.flows.report.episodes import index_row
    from trajforge.flows.report.gather import breakdowns

    def episode(i, harness, passed, status="ok", turns=4, tokens=100):
        r = {"rollout_id": f"r{i}", "env_id": "e", "teacher": "t", "harness": harness, "sample": i, "status": status,
             "turns": turns, "completion_tokens": tokens, "usage": []}
        v = {"verified": status == "ok", "passed": passed, "reward": float(passed), "hacks": [],
             "quality": {"labels": ["act", "verify"], "act_verify_share": 0.5}}
        return index_row(r, v, {"family": "f"}, "", 0)

    rows = [episode(0, BASH_HARNESS, True), episode(1, BASH_HARNESS, False, turns=8, tokens=300),
            episode(2, SWE_HARNESS, True), episode(3, SWE_HARNESS, False, status="infra_error", turns=0, tokens=0)]
    b = breakdowns(None, rows, [])
    table = {r[1]: dict(zip(b.harness_header, r)) for r in b.harnesses}
    assert table[BASH_HARNESS]["solve rate"] == 0.5 and table[BASH_HARNESS]["mean turns"] == 6.0
    assert table[BASH_HARNESS]["mean completion tokens"] == 200.0
    assert table[SWE_HARNESS]["solve rate"] == 1.0 and table[SWE_HARNESS]["episodes"] == 2  # the infra loss not judged
    assert breakdowns(None, rows[:2], []).harnesses == []


def test_envs_sample_shows_how_an_episode_starts_under_each_harness():
    """`trajforge envs sample FAMILY --harness all`: the system prompt, instruction and tools each harness that drives
    the kind begins an episode with (what run_episode sends first), fenced without tools; an unknown or unfitting
    harness is a named error listing the ones that fit."""
    from typer.testing import CliRunner

    from trajforge.flows.cli import app

    res = CliRunner().invoke(app, ["envs", "sample", "python_bugfix", "--harness", "all"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    starts = {s["harness"]: s for s in out["starts"]}
    assert {BASH_HARNESS, SWE_HARNESS, TERMINAL_HARNESS} <= set(starts) and TOOLS_HARNESS not in starts
    assert starts[BASH_HARNESS]["tools"] == ["bash", "submit"]
    assert starts[SWE_HARNESS]["tools"] == ["bash", "str_replace_editor", "submit"]
    assert starts[TERMINAL_HARNESS]["tools"] == ["send_keys", "submit"]
    instruction = get_family("python_bugfix").generate(1, 0).instruction
    for s in starts.values():
        assert [m["role"] for m in s["messages"]] == ["system", "user"] and s["messages"][1]["content"] == instruction
    assert "str_replace_editor" in starts[SWE_HARNESS]["messages"][0]["content"]
    fenced = json.loads(CliRunner().invoke(app, ["envs", "sample", "python_bugfix", "--harness", SWE_HARNESS,
                                                 "--fenced"]).output)["starts"][0]
    assert fenced["tools"] == [] and fenced["messages"][0]["content"] != starts[SWE_HARNESS]["messages"][0]["content"]
    bad = CliRunner().invoke(app, ["envs", "sample", "python_bugfix", "--harness", "nope"])
    assert bad.exit_code != 0 and "registered:" in bad.output and BASH_HARNESS in bad.output
    unfit = CliRunner().invoke(app, ["envs", "sample", "python_bugfix", "--harness", TOOLS_HARNESS])
    assert unfit.exit_code != 0 and "does not drive 'terminal'" in unfit.output and SWE_HARNESS in unfit.output


@pytest.mark.docker
def test_the_shipped_harness_build_commits_every_reference_solution_under_every_harness(tmp_path, prefect_api_url):
    """configs/harnesses.yaml as a user runs it without a model (teacher: replay, fenced as the shipped config):
    `trajforge build` commits 6 environments x each listed harness, every reference solution passes under every
    harness, rows name their harness, and the card and `trajforge report` compare the harnesses."""
    import datasets
    import yaml
    from helpers import run_cli

    from trajforge.schemas.config import load_config

    root = Path(__file__).parents[1]
    cfg = yaml.safe_load((root / "configs" / "harnesses.yaml").read_text())
    listed = cfg["rollout"]["harnesses"]
    cfg.update(runs=str(tmp_path / "runs"), teacher={"backend": "replay", "tool_calling": False})
    cfg.pop("extra_teachers")
    cfg["rollout"].update(samples_per_env=1)
    cfg["synthesize"]["audit"] = "off"  # the test audit of these families is tests/test_audit.py's (~a third of the build)
    (tmp_path / "h.yaml").write_text(yaml.safe_dump(cfg))
    load_config(tmp_path / "h.yaml")  # the edited shipped config is still valid
    out = run_cli("build", str(tmp_path / "h.yaml"), cwd=tmp_path, timeout=1200, prefect_api=prefect_api_url)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    folder = tmp_path / "runs" / cfg["dataset"] / "latest" / "dataset"
    rows = datasets.load_dataset(str(folder), "trajectories")["train"]
    assert len({r["env_id"] for r in rows}) == 6
    assert sorted((r["env_id"], r["harness"]) for r in rows) == sorted(
        (e, h) for e in {r["env_id"] for r in rows} for h in listed)
    assert all(r["passed"] and not r["hack_flags"] for r in rows), [
        (r["env_id"], r["harness"], r["status"]) for r in rows if not r["passed"]]
    card = (folder / "README.md").read_text()
    assert "## Harnesses compared" in card and all(f"`{h}`" in card.split("## Harnesses compared")[1] for h in listed)
    rep = run_cli("report", "--runs", str(tmp_path / "runs"), "--dataset", cfg["dataset"], cwd=tmp_path)
    assert rep.returncode == 0, rep.stderr[-2000:]
    html = next((tmp_path / "runs" / cfg["dataset"]).glob("*/report/index.html")).read_text()
    section = html.split('<section id="harnesses">', 1)[1].split("</section>", 1)[0]
    assert all(h in section for h in listed)
