"""Harness `trajforge-terminal-v1`, the interactive terminal: tools `send_keys` and `submit` over one persistent
terminal (a tmux session, 160x40, an interactive bash in the work dir) that lives for the whole episode.

The shape is the reference terminal agents' (Terminal-Bench's Terminus): the model types keystrokes and waits,
and its observation is the visible screen (`tmux capture-pane -p`: at most 40 lines of 160 columns), so
interactive programs (a `python3` REPL, `less`, `vi`), pagers and long-running processes work as they would for
a person at a terminal. `send_keys`: `keys`, a list of tmux `send-keys` arguments (a key name such as `Enter`,
`C-c`, `C-d`, `Escape`, `Tab`, `Up`; any other string is typed as it is, a newline in it pressing Enter) or, with
`literal`, text typed character by character (`send-keys -l`); `wait_seconds` (default 2, at most the command
timeout and the episode's remaining budget): the longest to wait before the screen is read. The wait ends early
when the shell prints its prompt again (its PROMPT_COMMAND appends a dot to a tmux option at each prompt), and, with no keys
sent, at once when the shell is already idle. Nothing sent is ever killed by the harness: a command still
running when the wait runs out keeps running into the next turn (the model can wait, look again, or send
`C-c`), and the answer then starts `[still running after N s: PROGRAM in the foreground ...]` (the named
outcome `still_running`, the step's exit code 124, `timed_out`, no `killed_by`).

Each call is a `Step` whose command is a self-contained bash script: a comment line naming the call (its
arguments as JSON), comment lines `#| ` showing the text typed (what hack evidence reads as the agent's shell),
then the program that starts the session when there is none (as the agent, the exec's environment: the agent's
PATH), sends the keys, waits and prints the screen (a sibling replay re-runs it). Exit codes name the outcome
(`OUTCOMES`). The shell is `bash --noprofile --norc +H` (history expansion off; no history file written) with
prompt `\\w$ `; a session the model ended (`exit`, `tmux kill-server`) is started again at its next call, and
the answer says so.

The terminal ends with the episode: `close()` (before the episode's processes are settled and its files
captured) kills the tmux server and removes its socket, so no process, pane or socket of the episode's terminal
is there when the verifier runs (whatever the server started that outlives it is the agent's leftover process,
killed and counted by the settle as with bash). An image without tmux ends the episode before the first turn
as `harness_unavailable` (nothing asked of the teacher), naming tmux.

Replay (`render`): each recorded command is typed as one literal call `(`, newline, the command, newline,
`) </dev/null`, Enter, with the longest wait: a subshell keeps the command's `cd`, `exit`, `set -e` and
variables to itself and its stdin off the terminal, as each command of the bash harness runs in a fresh
shell in the work dir with no input; a tab or other control character is typed after C-v (readline's quoted
insert: no completion); the wait ends at the next prompt, which the subshell's end prints.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import shlex
import time
from typing import Any

from ....schemas.environment import EnvSpec
from ....schemas.trajectory import TERMINAL_HARNESS, Message, Step
from ...sandbox import SandboxStopped
from ..harness import FENCE, TOOLS, HarnessUnavailable
from ..mcp_relay import parse_fenced
from . import Call, Harness, register

SOCKET = "trajforge"  # tmux -L: the server's socket, /tmp/tmux-UID/trajforge (TMUX_TMPDIR)
SESSION = "agent"
WIDTH, HEIGHT = 160, 40
DEFAULT_WAIT_S = 2.0
MAX_KEY_BYTES = 64 << 10  # the keys of one call, base64: one bash -c command holds at most 128 KiB
MARK = "__TF_TERMINAL__"
OUTCOMES: dict[str, int] = {"ok": 0, "session_ended": 0, "still_running": 124, "terminal_failed": 125, "unavailable": 127, "too_large": 7}
PROMPT = r"\w\$ "
SEND_KEYS = {"type": "function", "function": {
    "name": "send_keys",
    "description": (
        "Type into the terminal (an interactive bash in a persistent tmux session that lasts the whole task; "
        "programs keep running between calls), then wait and return the visible screen. Each item of `keys` is a "
        "tmux key name (Enter, C-c, C-d, C-z, Escape, Tab, BSpace, Up, Down, Left, Right, PageUp, PageDown, "
        "Home, End, Space) or text typed as it is (a newline in text presses Enter); `literal`: every item is "
        "typed as text. The wait ends when the shell shows its prompt again or after `wait_seconds`; a command "
        "still running then keeps running: call again with no keys to wait and look, or send C-c. "
        'Example: {"keys": ["ls -la", "Enter"], "wait_seconds": 2}.'),
    "parameters": {"type": "object", "properties": {
        "keys": {"type": "array", "items": {"type": "string"},
                 "description": "tmux send-keys arguments: key names or text; empty: just wait and look."},
        "wait_seconds": {"type": "number",
                         "description": f"The longest to wait before the screen is read (default {DEFAULT_WAIT_S:g})."},
        "literal": {"type": "boolean", "description": "Type every item as text (no key names)."}},
        "required": ["keys"]}}}
TERMINAL_TOOLS = [SEND_KEYS, TOOLS[1]]
SYSTEM_PROMPT = (
    "You are an expert at the Linux command line, working in a sandbox with no network access, through an "
    "interactive terminal (a {width}x{height} tmux screen running bash in {workdir}; the session persists, so "
    "`cd`, variables and running programs carry over). Use the `send_keys` tool to type commands and keys "
    "(e.g. [\"make test\", \"Enter\"], or [\"C-c\"] to interrupt) and to read the screen; interactive "
    "programs (a REPL, a pager, an editor) work as in a real terminal. When the task is done, call the "
    "`submit` tool."
)
FENCED_HINT = (" Tools are unavailable: reply with exactly one ```json fenced block {\"tool\": \"send_keys\", "
               "\"arguments\": {\"keys\": [...], \"wait_seconds\": N}} per turn (or a ```bash block: its text is "
               "typed, then Enter), and reply with the single word SUBMIT when the task is done. send_keys: "
               + SEND_KEYS["function"]["description"])


def _script_head(args: dict[str, Any]) -> str:
    """The step's comment lines: the call as JSON (one line, every control character escaped), then each line of
    the text typed after `#| ` (text only: key names are not typed text; readline's C-v shown as ^V)."""
    text = "".join(k for k in args["keys"] if args.get("literal") or not _key_name(k))
    shown = "".join(f"#| {line}\n" for line in text.replace("\x16", "^V").replace("\r", "\n").split("\n")
                    if line.strip()) if text.strip() else ""
    return f"# send_keys {json.dumps(args, sort_keys=True)}\n{shown}"


KEY_NAME = re.compile(r"\A(?:(?:[CMS]-)+.|\^.|F(?:[1-9]|1[0-2])|Enter|Escape|Tab|BTab|BSpace|Space|Up|Down|Left|"
                      r"Right|Home|End|IC|DC|Insert|Delete|NPage|PPage|PageUp|PageDown|PgUp|PgDn|KP\w+)\Z", re.I)


def _key_name(item: str) -> bool:
    """Whether tmux `send-keys` (no -l) reads `item` as a key name rather than text to type (an approximation
    used for the step's `#| ` lines only: tmux itself decides)."""
    return bool(KEY_NAME.match(item))


def terminal_script(args: dict[str, Any], wait_s: float, workdir: str) -> str:
    """The bash program of one `send_keys` call (see the module docstring); prints `MARK STATE PROGRAM NEW`, then
    the screen. `args["keys"]` go base64-encoded (no model-supplied string reaches a shell)."""
    keys = " ".join(shlex.quote(base64.b64encode(k.encode()).decode()) for k in args["keys"])
    ticks = max(0, int(round(wait_s * 100)))  # /proc/uptime counts hundredths of a second
    return _script_head(args) + f"""\
T=$(command -v tmux) || {{ echo "{MARK} unavailable - 0"; exit {OUTCOMES['unavailable']}; }}
t() {{ "$T" -u -f /dev/null -L {SOCKET} "$@"; }}
count() {{ c=$(t show-options -gv @tf_prompts 2>/dev/null) || return 1; echo ${{#c}}; }}
idle() {{ p=$(t display-message -p -t {SESSION} '#{{pane_pid}}' 2>/dev/null) && read -r -a f < /proc/$p/stat && [ "${{f[7]}}" = "$p" ]; }}
new=0
if ! t has-session -t {SESSION} 2>/dev/null; then
  t set-option -g status off \\; set-option -g history-limit 10000 \\; set-option -g @tf_prompts . \\; \\
    new-session -d -s {SESSION} -x {WIDTH} -y {HEIGHT} -c {shlex.quote(workdir)} \\
    "exec env HISTFILE= PS1={shlex.quote(PROMPT)} PROMPT_COMMAND='$T -L {SOCKET} set-option -gaq @tf_prompts . 2>/dev/null' bash --noprofile --norc +H" \\
    || {{ echo "{MARK} terminal_failed - 0"; exit {OUTCOMES['terminal_failed']}; }}
  new=1
  for i in $(seq 50); do [ "$(count)" -ge 2 ] && break; sleep 0.1; done
fi
n0=$(count) || n0=0
set --
for k in {keys}; do v=$(printf %s "$k" | base64 -d; echo x); set -- "$@" "${{v%x}}"; done
if [ $# -gt 0 ]; then t send-keys -t {SESSION} {'-l ' if args.get('literal') else ''}-- "$@" || {{ echo "{MARK} terminal_failed - $new"; exit {OUTCOMES['terminal_failed']}; }}; fi
state=ok
now() {{ read -r u _ < /proc/uptime; u=${{u/./}}; echo $((10#$u)); }}
end=$(( $(now) + {ticks} ))
while :; do
  n=$(count) || {{ state=session_ended; break; }}
  [ "$n" -gt "$n0" ] && break
  [ $# -eq 0 ] && idle && break
  [ "$(now)" -lt $end ] || {{ idle || state=still_running; break; }}
  sleep 0.1
done
echo "{MARK} $state $(t display-message -p -t {SESSION} '#{{pane_current_command}}' 2>/dev/null | tr -c '[:alnum:]._+\\n-' _ | head -c 40) $new"
t capture-pane -p -t {SESSION} 2>/dev/null
[ $state != still_running ] || exit {OUTCOMES['still_running']}
"""


def close_script() -> str:
    """Kill the episode's tmux server (every pane's processes get SIGHUP) and remove its socket."""
    return (f'T=$(command -v tmux) || exit 0; "$T" -L {SOCKET} kill-server 2>/dev/null; '
            f'd="${{TMUX_TMPDIR:-/tmp}}/tmux-$(id -u)"; rm -f "$d/{SOCKET}"; rmdir "$d" 2>/dev/null; exit 0')


def invalid(args: dict[str, Any]) -> str | None:
    """Why `send_keys` arguments do not fit the tool, else None (`keys` may be one string: one item)."""
    keys = args.get("keys")
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        return "format error: `keys` must be a list of strings (key names such as Enter, C-c, or text)"
    wait = args.get("wait_seconds", DEFAULT_WAIT_S)
    if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not wait >= 0:
        return "format error: `wait_seconds` must be a number >= 0"
    if not isinstance(args.get("literal", False), bool):
        return "format error: `literal` must be true or false"
    if any("\x00" in k for k in keys):
        return "format error: `keys` cannot hold a NUL character"
    return None


class TerminalMode:
    """The turns of one episode of this harness over its sandbox (`ep`: sandbox, state, settings, the shared
    tool-call loop). The tmux session is the sandbox's; `calls` counts the calls that reached it."""

    what = "send_keys call"

    def __init__(self, ep: Any, env: EnvSpec):
        self.ep, self.st, self.s, self.env = ep, ep.st, ep.s, env
        self.calls = 0
        self.closed = False

    async def offered(self) -> list[dict]:
        """The tools; raises HarnessUnavailable when the image has no tmux (checked once the container runs; an
        episode's preview, `harness.episode_start`, has no sandbox to check)."""
        if self.ep.sb is None:
            return TERMINAL_TOOLS if self.s.tool_calling else []
        await self.ep.started
        res = await asyncio.to_thread(self.ep.sb.exec, "command -v tmux", 30)
        if res.exit_code != 0:
            raise HarnessUnavailable(f"{TERMINAL_HARNESS} needs tmux, which the image {self.ep.sb.image} does not "
                                     "have (not on the agent's PATH): install tmux in the environment's image")
        return TERMINAL_TOOLS if self.s.tool_calling else []

    def system_prompt(self, env: EnvSpec) -> str:
        return (SYSTEM_PROMPT.format(width=WIDTH, height=HEIGHT, workdir=env.workdir)
                + ("" if self.s.tool_calling else FENCED_HINT))

    async def close(self) -> None:
        """Kill the tmux server and remove its socket (idempotent; a container already stopped: nothing to do)."""
        started = self.ep.started
        if self.closed or not started.done() or started.cancelled() or started.exception() is not None:
            return
        self.closed = True
        if self.ep.sb.stopped:
            return
        try:
            await asyncio.to_thread(self.ep.sb.exec, close_script(), 30)
        except SandboxStopped:  # the agent stopped its own container (`sb.stopped`): no terminal is left to end
            pass

    async def answer(self, turn: int, name: str, args: dict | str) -> str:
        if isinstance(args, str):
            self.st.format_errors += 1
            return f"format error: arguments are not valid JSON ({args})"
        if name != "send_keys":
            self.st.format_errors += 1
            return "format error: use send_keys (keys, wait_seconds) or submit"
        if isinstance(args.get("keys"), str):
            args = {**args, "keys": [args["keys"]]}
        why = invalid(args)
        if why:
            self.st.format_errors += 1
            return why
        self.st.format_errors = 0
        return await self.send(turn, args)

    async def send(self, turn: int, args: dict[str, Any]) -> str:
        """Run one call in the sandbox, record it as a step, return the observation."""
        remaining = max(0.0, self.st.deadline - time.monotonic())
        wait = min(float(args.get("wait_seconds", DEFAULT_WAIT_S)), self.s.command_timeout_s, remaining)
        call = {"keys": args["keys"], "wait_seconds": round(wait, 3), "literal": bool(args.get("literal", False))}
        if sum(len(k.encode()) for k in call["keys"]) * 4 // 3 > MAX_KEY_BYTES:  # answered here: nothing sent
            why = f"[too_large: the keys of one call are at most {MAX_KEY_BYTES * 3 // 4} bytes; type in parts]"
            self.st.steps.append(Step(turn=turn, command=_script_head(call) + ": too_large, nothing sent",
                                      exit_code=OUTCOMES["too_large"], duration_s=0.0))
            return why
        script = terminal_script(call, wait, self.env.workdir)
        await self.ep.started
        res = await asyncio.to_thread(self.ep.sb.exec, script, wait + 30)
        self.calls += 1
        self.st.steps.append(Step(turn=turn, command=script, exit_code=res.exit_code, duration_s=round(res.duration_s, 4),
                                  timed_out=res.exit_code == OUTCOMES["still_running"] or res.timed_out,
                                  killed_by=res.killed_by, output_bytes=res.output_bytes, truncated=res.truncated))
        head, _, screen = res.output.partition("\n")
        parts = head.split(" ")
        if len(parts) != 4 or parts[0] != MARK or parts[1] not in OUTCOMES:
            why = {"timeout": " [killed: the terminal did not answer in time]"}.get(res.killed_by or "", "")
            return f"[terminal_failed: exit code {res.exit_code}]{why}\n{res.output[-2000:]}".rstrip()
        state, program, new = parts[1], parts[2], parts[3] == "1"
        screen = "\n".join(line.rstrip() for line in screen.rstrip().split("\n"))
        notes = []
        if new and self.calls > 1:
            notes.append("[the terminal session had ended; a new one was started]")
        if state == "still_running":
            notes.append(f"[still running after {wait:g} s: {program} in the foreground; send keys, wait (no keys), "
                         "or C-c]")
        elif state == "session_ended":
            notes.append("[the terminal session ended (its shell exited); the next call starts a new one]")
        return "\n".join([*notes, screen]) if notes else screen

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
            st.messages.append(Message(role="user", content=f"Screen:\n{await self.answer(turn, *call)}"))
        elif block and block[0].strip():
            st.format_errors = 0
            screen = await self.send(turn, {"keys": [block[0].strip() + "\n"], "literal": True})
            st.messages.append(Message(role="user", content=f"Screen:\n{screen}"))
        elif isinstance(call, tuple) or re.search(r"\bSUBMIT\b", text):
            st.submitted = True
        else:
            st.format_errors += 1
            why = call or ("your reply hit the token limit before any command" if cut else "no send_keys call found")
            st.messages.append(Message(role="user", content=(
                f"format error: {why}. Reply with one ```json block {{\"tool\": \"send_keys\", \"arguments\": "
                "{\"keys\": [...]}}, or SUBMIT when done.")))


# -- replay rendering ---------------------------------------------------------------------------------
CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f]")


def typed(command: str) -> str:
    """`command` as text typed into the terminal's bash, run like a bash-harness command: in a subshell (its `cd`,
    `exit`, `set -e`, variables stay there) with no input; control characters but the newline after C-v."""
    body = CONTROL.sub(lambda m: "\x16" + m.group(), command.strip("\n"))
    return f"(\n{body}\n) </dev/null\n"


def render(env: EnvSpec, commands: list[str]) -> list[Call]:
    """Each recorded command as one literal `send_keys` call that types it and waits for the prompt."""
    return [("send_keys", {"keys": [typed(c)], "literal": True, "wait_seconds": 3600})
            for c in commands if c.strip()]


HARNESS = register(Harness(name=TERMINAL_HARNESS, kinds=("terminal",), mode=TerminalMode, render=render,
                           description="send_keys (tmux keystrokes + wait, the screen as observation) + submit"))
