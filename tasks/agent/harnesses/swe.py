"""Harness `trajforge-swe-v1`, the file-editing software-engineering harness: tools `bash` (as in
`trajforge-bash-v1`), `str_replace_editor` and `submit`.

`str_replace_editor` has the command names, argument shapes and answer texts of the widely used SWE scaffolds'
editor (Anthropic's text editor tool, SWE-agent, OpenHands): `command` one of view / create / str_replace /
insert / undo_edit, `path` (absolute), `file_text`, `old_str`, `new_str`, `insert_line`, `view_range`. Each call
runs in the sandbox as the agent (`editor_program.py`, its arguments base64-encoded: no model-supplied string
reaches a shell) and is a `Step` whose command is that self-contained shell command (a comment line naming the
call and its path, then the program: a sibling replay re-runs it) and whose exit code names the outcome (`OUTCOMES`: 0 ok, 3 no_match, 4 not_unique, 5 missing_path,
6 outside, 7 binary, ...). The editor touches only the environment's work dir (`outside` otherwise, symbolic
links resolved), refuses binary, non-regular and > 2 MiB files, and views long files by `view_range` with
`cat -n` numbering. The undo history is the harness's, per episode and per path (the content before each
edit, read back from the program), never a file in the sandbox. Differences from Anthropic's tool: tabs are
expanded only in what is shown, never in what is written; `undo_edit` of a `create` removes the file.

A call whose arguments do not fit the schema (unknown command, a missing required parameter, a wrong type) is
the model's format error (the scaffolds' text, nothing run, no step); a refusal (`no_match`, `outside`, ...) is
a valid call with its named outcome. Without tool calling a turn is one ```bash block, or one ```json block
{"tool": "str_replace_editor", "arguments": {...}}, or SUBMIT.

Replay (`render`): a reference solution's command that writes one file with a quoted heredoc (`cat > PATH <<'EOF'`)
becomes `create` (a new file) or a whole-content `str_replace` (a file whose content the renderer knows: the
environment's own files, or one it wrote itself), and a `python3` script replacing literal strings in one file
(`src.replace(bad, good)` pairs, the `python_bugfix` shape) becomes one `str_replace` per pair when each string
occurs once in the known content; any other command (and what follows a heredoc in the same command) is
replayed through `bash`, after which the renderer forgets what it knew of the files.
"""

from __future__ import annotations

import asyncio
import base64
import json
import posixpath
import re
import time
from pathlib import Path
from typing import Any

from ....schemas.environment import EnvSpec
from ....schemas.trajectory import EDITOR_STEP, SWE_HARNESS, Message, Step
from ..harness import FENCE, TOOLS
from ..mcp_relay import SURROGATE, parse_fenced
from . import Call, Harness, editor_program, register

PROGRAM = Path(editor_program.__file__).read_text()
TAG = "TRAJFORGE_EDITOR_PROGRAM"
OUTCOMES: dict[str, int] = editor_program.OUTCOMES  # the exit code of each named outcome of a call
COMMANDS = editor_program.COMMANDS
CHUNK = 96 << 10  # base64 characters per argv string (Linux: 128 KiB each)
MAX_ARGUMENT_BYTES = 96 << 10  # the arguments' JSON, base64: one shell command (`bash -c`) holds at most 128 KiB
EDITOR = {"type": "function", "function": {
    "name": "str_replace_editor",
    "description": ("View, create and edit text files. `view` shows a file with line numbers (`cat -n`), or "
                    "lists a directory two levels deep; `view_range` [start, end] shows lines start..end (end -1: "
                    "to the end). `create` writes a new file (`file_text`). `str_replace` replaces `old_str`, which "
                    "must occur exactly once, verbatim, whitespace included, with `new_str`. `insert` puts "
                    "`new_str` after line `insert_line` (0: at the top). `undo_edit` reverts the last edit of "
                    "`path`. Paths are absolute."),
    "parameters": {"type": "object", "properties": {
        "command": {"type": "string", "enum": list(COMMANDS),
                    "description": "The command to run: view, create, str_replace, insert or undo_edit."},
        "path": {"type": "string", "description": "Absolute path to a file or directory."},
        "file_text": {"type": "string", "description": "`create`: the content of the file."},
        "old_str": {"type": "string", "description": "`str_replace`: the exact text to replace."},
        "new_str": {"type": "string", "description": "`str_replace`: the new text; `insert`: the text to insert."},
        "insert_line": {"type": "integer", "description": "`insert`: the line after which `new_str` goes."},
        "view_range": {"type": "array", "items": {"type": "integer"},
                       "description": "`view` of a file: [start, end] lines, 1-based; end -1: to the end."}},
        "required": ["command", "path"]}}}
SWE_TOOLS = [TOOLS[0], EDITOR, TOOLS[1]]
SYSTEM_PROMPT = (
    "You are an expert software engineer working in a sandbox with no network access. The files are in "
    "{workdir}. Use the `bash` tool to run commands (each in a fresh bash shell in that directory) and the "
    "`str_replace_editor` tool to view, create and edit files (absolute paths). Check your result. When the "
    "task is done, call the `submit` tool."
)
FENCED_HINT = (" Tools are unavailable: reply with exactly one ```bash fenced block holding one command, or one "
               "```json fenced block {\"tool\": \"str_replace_editor\", \"arguments\": {...}} per turn, and reply "
               "with the single word SUBMIT when the task is done. str_replace_editor: "
               + EDITOR["function"]["description"] + " Arguments (JSON Schema): "
               + json.dumps(EDITOR["function"]["parameters"], sort_keys=True))
REQUIRED = {"create": ("file_text",), "str_replace": ("old_str",), "insert": ("insert_line", "new_str")}
TYPES = {"path": str, "file_text": str, "old_str": str, "new_str": str, "insert_line": int, "view_range": list}


def editor_command(command: str, arguments: dict[str, Any]) -> str:
    """The shell command that runs one editor call in the sandbox: a comment naming the call (`command`, one of
    `COMMANDS`, and the path as a JSON string: one line, nothing a shell reads), then the program on stdin (a
    quoted heredoc, its text fixed) with the arguments as base64 argv chunks. What reads steps as shell (quality
    labels, hack evidence, a sibling replay) sees the path named and the edit re-runnable."""
    assert command in COMMANDS
    blob = base64.b64encode(json.dumps(arguments).encode()).decode()
    chunks = " ".join(blob[i:i + CHUNK] for i in range(0, len(blob), CHUNK)) or "e30="
    named = json.dumps(arguments.get("path", ""))  # ASCII, escapes every control character: no newline ends the comment
    shell = (f"# str_replace_editor {command} {named}\n"
             f"python3 -I - str_replace_editor {command} {chunks} <<'{TAG}'\n{PROGRAM}\n{TAG}")
    assert EDITOR_STEP.match(shell)  # what the judge reads a step's editor call from (judge/quality.py)
    return shell


def invalid(args: dict[str, Any]) -> str | None:
    """Why a call's arguments do not fit the tool (the scaffolds' texts where they have one), else None."""
    command = args.get("command")
    if command not in COMMANDS:
        return (f"Unrecognized command {command}. The allowed commands for the str_replace_editor tool are: "
                f"{', '.join(COMMANDS)}")
    if not isinstance(args.get("path"), str) or not args["path"]:
        return f"Parameter `path` is required for command: {command}"
    for name in REQUIRED.get(command, ()):
        if args.get(name) is None:
            return f"Parameter `{name}` is required for command: {command}"
    for name, kind in TYPES.items():
        value = args.get(name)
        if value is not None and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
            return f"Parameter `{name}` must be {'an integer' if kind is int else 'a ' + kind.__name__}"
    return None


class EditorMode:
    """The turns of one episode of this harness, over the episode (`ep`: sandbox, state, settings, `run` for
    bash, the shared tool-call loop). `history`: per normalised path, the content before each successful edit
    (None: the file did not exist), newest last."""

    what = "command or edit"

    def __init__(self, ep: Any, env: EnvSpec):
        self.ep, self.st, self.s, self.root = ep, ep.st, ep.s, env.workdir
        self.history: dict[str, list[bytes | None]] = {}

    async def offered(self) -> list[dict]:
        return SWE_TOOLS if self.s.tool_calling else []

    def system_prompt(self, env: EnvSpec) -> str:
        return SYSTEM_PROMPT.format(workdir=env.workdir) + ("" if self.s.tool_calling else FENCED_HINT)

    async def close(self) -> None:
        """Nothing held open in the sandbox."""

    async def answer(self, turn: int, name: str, args: dict | str) -> str:
        if name == "str_replace_editor":
            if isinstance(args, str):
                self.st.format_errors += 1
                return f"format error: arguments are not valid JSON ({args})"
            return await self.edit(turn, args)
        if name == "bash":
            return await self.ep.answer(turn, name, args)
        self.st.format_errors += 1
        return "format error: use bash with a non-empty `command`, str_replace_editor, or submit"

    async def edit(self, turn: int, args: dict[str, Any]) -> str:
        """One editor call: refused on the host when its arguments do not fit (a format error), answered from
        the history for an undo with none, else run in the sandbox and recorded as a step."""
        why = invalid(args)
        if why:
            self.st.format_errors += 1
            return why
        self.st.format_errors = 0
        command, path = args["command"], args["path"]
        key = posixpath.normpath(path)
        payload = {k: args[k] for k in ("path", "file_text", "old_str", "new_str", "insert_line", "view_range")
                   if args.get(k) is not None}
        payload["root"] = self.root
        if command == "undo_edit":
            if not self.history.get(key):
                return self._record(turn, command, path, "no_history", f"No edit history found for {path}.")
            previous = self.history[key][-1]
            payload["restore"] = None if previous is None else base64.b64encode(previous).decode()
        observation, outcome, before = await self._run(turn, command, payload)
        if outcome == "ok" and command == "undo_edit":
            self.history[key].pop()
        elif outcome == "ok" and command != "view":
            self.history.setdefault(key, []).append(before)
        return observation

    async def _run(self, turn: int, command: str, payload: dict[str, Any]) -> tuple[str, str, bytes | None]:
        """(observation, outcome, content before the edit) of one call run in the sandbox."""
        shell = editor_command(command, payload)
        if len(shell) - len(PROGRAM) > MAX_ARGUMENT_BYTES:
            why = (f"The arguments of this call are too large ({len(shell) - len(PROGRAM)} bytes encoded; at most "
                   f"{MAX_ARGUMENT_BYTES}). Write the file in parts (create, then insert), or with bash.")
            return self._record(turn, command, payload["path"], "too_large", why), "too_large", None
        await self.ep.started
        budget = min(self.s.command_timeout_s, max(1.0, self.st.deadline - time.monotonic()))
        res = await asyncio.to_thread(self.ep.sb.exec, shell, budget, output_limit=4 << 20)
        try:  # the agent's own python3 answers here: its output is read as data, never trusted to be well formed
            out = json.loads(res.output.strip().splitlines()[-1])
            outcome, text = out["outcome"], out["text"]
            if not isinstance(outcome, str) or not isinstance(text, str) or SURROGATE.search(text):
                raise TypeError("not an answer of the editor program")
            old = base64.b64decode(out["old"], validate=True) if out.get("old") is not None else None
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):  # python3 missing, killed, a shim
            why = {"timeout": " [killed: command timed out]", "oom": " [killed: out of memory]"}.get(res.killed_by or "", "")
            outcome, old = "editor_failed", None
            text = f"[editor failed: exit code {res.exit_code}]{why}\n{res.output[-2000:]}".rstrip()
        self.st.steps.append(Step(turn=turn, command=shell, exit_code=res.exit_code, duration_s=round(res.duration_s, 4),
                                  timed_out=res.timed_out, killed_by=res.killed_by, output_bytes=res.output_bytes,
                                  truncated=res.truncated))
        return text, outcome, old

    def _record(self, turn: int, command: str, path: str, outcome: str, text: str) -> str:
        """A call answered on the host: still a step, its exit code the outcome's, its command the comment naming the
        call and a no-op (nothing ran in the sandbox, so nothing runs when the step is replayed)."""
        shell = f"# str_replace_editor {command} {json.dumps(path)}\n: {outcome}, answered without running"
        self.st.steps.append(Step(turn=turn, command=shell, exit_code=OUTCOMES[outcome], duration_s=0.0))
        return text

    async def handle_tool_calls(self, turn: int, msg: Message) -> None:
        await self.ep.handle_tool_calls(turn, msg, self.answer)

    async def handle_text(self, turn: int, msg: Message, cut: bool = False) -> None:
        st = self.st
        if self.ep.garbled(msg):
            return
        text = msg.content or ""
        call = parse_fenced(text) if "```json" in text or "<tool_call>" in text else None
        block = FENCE.findall(text)
        if isinstance(call, tuple) and call[0] != "submit":
            result = await self.answer(turn, *call)
            st.messages.append(Message(role="user", content=f"Result of {call[0]}:\n{result}"))
        elif block and block[0].strip():
            st.format_errors = 0
            st.messages.append(Message(role="user", content=f"Output:\n{await self.ep.run(turn, block[0].strip())}"))
        elif isinstance(call, tuple) or re.search(r"\bSUBMIT\b", text):
            st.submitted = True
        else:
            st.format_errors += 1
            why = call or ("your reply hit the token limit before any command" if cut else "no command found")
            st.messages.append(Message(role="user", content=(
                f"format error: {why}. Put one command in a ```bash block, or one ```json block "
                "{\"tool\": \"str_replace_editor\", \"arguments\": {...}}, or SUBMIT when done.")))


# -- replay rendering ---------------------------------------------------------------------------------
HEREDOC = re.compile(r"\Acat\s*>\s*(?P<path>[\w./+-]+)\s*<<-?\s*(?P<q>['\"])(?P<tag>\w+)(?P=q)[ \t]*\n"
                     r"(?P<body>.*?\n)?(?P=tag)[ \t]*(?:\n|\Z)", re.S)
REPLACE_SCRIPT = re.compile(
    r"\Apython3 - <<'PY'\nimport json, pathlib\npath = pathlib\.Path\('(?P<path>[^'\\]+)'\)\nsrc = path\.read_text\(\)\n"
    r"for bad, good in json\.loads\('(?P<pairs>(?:[^'\\]|\\.)*)'\):\n    src = src\.replace\(bad, good\)\n"
    r"path\.write_text\(src\)\nPY\s*\Z")


def _literal(text: str) -> str:
    """A Python single-quoted literal's body (the escapes json.dumps-then-repr produce) as its value."""
    import ast

    return ast.literal_eval(f"'{text}'")


def render(env: EnvSpec, commands: list[str]) -> list[Call]:
    """The replay calls of `commands` in this harness (see the module docstring for which become editor calls)."""
    known = {posixpath.normpath(posixpath.join(env.workdir, f.path)): f.content for f in env.files}
    calls: list[Call] = []

    def bash(command: str) -> None:
        if command.strip():
            calls.append(("bash", {"command": command}))
            known.clear()

    for command in commands:
        if m := HEREDOC.match(command):
            path = posixpath.normpath(posixpath.join(env.workdir, m["path"]))
            body = m["body"] or ""
            if path in known and known[path]:
                calls.append(("str_replace_editor", {"command": "str_replace", "path": path,
                                                     "old_str": known[path], "new_str": body}))
            elif path not in known:
                calls.append(("str_replace_editor", {"command": "create", "path": path, "file_text": body}))
            else:  # an empty known file: no old_str to replace
                bash(command[:m.end()])
                continue
            known[path] = body
            bash(command[m.end():])
            continue
        if (m := REPLACE_SCRIPT.match(command)) and (path := posixpath.normpath(
                posixpath.join(env.workdir, m["path"]))) in known:
            try:
                pairs = json.loads(_literal(m["pairs"]))
            except (ValueError, SyntaxError):
                pairs = None
            text, edits = known[path], []
            for bad, good in pairs or [[None, None]]:
                if not isinstance(bad, str) or not isinstance(good, str) or not bad or text.count(bad) != 1:
                    edits = None
                    break
                edits.append(("str_replace_editor", {"command": "str_replace", "path": path,
                                                     "old_str": bad, "new_str": good}))
                text = text.replace(bad, good)
            if edits:
                calls += edits
                known[path] = text
                continue
        bash(command)
    return calls


HARNESS = register(Harness(name=SWE_HARNESS, kinds=("terminal",), mode=EditorMode, render=render,
                           description="bash + str_replace_editor (view/create/str_replace/insert/undo_edit) + submit"))
