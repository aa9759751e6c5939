"""Trajectory-quality signals as columns (Terminal-Lego's environment-grounded supervision: trajectories
that show inspect -> act -> verify routines teach best; plus redundancy and error recovery).

Every command is labelled:
- `act`: changes state: writes a file (`>`, `>>`, `tee`, `sed -i`, a heredoc into a file, Python that
  writes), moves/copies/removes/creates files, changes permissions, commits or resets git, installs;
- `verify`: checks a result: runs tests or a validator/checker, compares (`diff`, `cmp`, `test`), or
  reads/executes something an earlier `act` produced;
- `inspect`: everything else that looks around (ls, cat, grep, find, head, git log, sqlite SELECT...).
Signals (all computed from the stored steps, no container needed): inspect before the first act, the
share of acts followed by a verify before the next act, ending with a verification, repeated
commands, failed commands and recoveries (a failed command followed later by a succeeding one of the
same program), and the processes the agent left running (killed before any judging).
Labels and every other shell-pattern reading look only at `shell_steps`: the steps of a tool episode
are tool calls whose arguments are domain data, not shell text (no labels; the counts stay).
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex

from ...schemas.trajectory import EDITOR_STEP, TOOLS_HARNESS, Rollout, Step
from ...schemas.verdict import Quality

WRITE = re.compile(
    r"(?<![<>&|2])>{1,2}\s*(?!&|/dev/null)[\w./~-]"     # > file, >> file (not 2>, not >&, not /dev/null)
    r"|\btee\b|\bsed\s+(-\w*\s+)*-i|\bperl\s+-\w*i"
    r"|\b(mv|cp|rm|rmdir|mkdir|touch|chmod|chown|ln|truncate|install|patch|unzip|tar\s+-?x)\b"
    r"|\bgit\s+(commit|add|reset|checkout|rm|mv|apply|stash|merge|rebase|restore|switch)\b"
    r"|\b(pip|apt|apt-get|npm)\s+install\b"
    r"|open\([^)]*['\"][wa]b?['\"]|write_text|write_bytes|json\.dump\(|\.to_csv\(|\.to_json\(|shutil\.(copy|move)"
    r"|cat\s*>|<<\s*['\"]?\w+['\"]?\s*>")
CHECK = re.compile(r"\b(pytest|unittest|validate|validator|check|verify|test_\w+|diff|cmp|sha256sum|md5sum)\b"
                   r"|\btest\s+-|\[\s+-[efsdx]\s|\bpython3?\s+-m\s+(pytest|unittest)\b")
FILE_TOKEN = re.compile(r"[\w./-]+\.[A-Za-z0-9]{1,8}\b|[\w-]+\.sh\b")


def _written_files(command: str) -> set[str]:
    """File names an `act` command writes (targets of redirections and a few common writers)."""
    out = set(re.findall(r">{1,2}\s*([\w./~-]+)", command))
    out |= set(re.findall(r"\btee\s+(?:-a\s+)?([\w./~-]+)", command))
    out |= set(re.findall(r"open\(\s*['\"]([^'\"]+)['\"]\s*,\s*['\"][wa]", command))
    out |= set(re.findall(r"(?:Path\(|pathlib\.Path\()\s*['\"]([^'\"]+)['\"]\s*\)\s*\.write_", command))
    try:
        words = shlex.split(command, posix=True)
    except ValueError:
        words = command.split()
    for i, w in enumerate(words[:-1]):
        if w in ("mv", "cp", "touch", "mkdir"):
            out.add(words[-1])
    return {o.rstrip(";").lstrip("./") for o in out if o and o != "/dev/null"}


def shell_steps(r: Rollout) -> list[Step]:
    """The steps that are shell commands: all of a terminal episode's, none of a tool episode's
    (harness `trajforge-mcp-v1`: each step is a tool call, `call_command(name, arguments)`). The one
    place shell-pattern detectors (here and in hacks.py) decide what they may read."""
    return [] if r.harness == TOOLS_HARNESS else list(r.steps)


def _edit(command: str) -> tuple[str, str] | None:
    """(editor command, path) of a step that ran one `str_replace_editor` call (`EDITOR_STEP`), else None."""
    m = EDITOR_STEP.match(command)
    return (m["command"], json.loads(m["path"])) if m else None


def label_steps(steps: list[Step]) -> list[str]:
    """`act` / `verify` / `inspect` per step, from its shell text; an editor call (`EDITOR_STEP`) by its command:
    a `view` inspects (verifies a file an earlier step wrote), every other command acts on its path."""
    labels, produced = [], set()
    for s in steps:
        cmd = s.command
        if edit := _edit(cmd):
            names = {edit[1].lstrip("./"), posixpath.basename(edit[1])}
            if edit[0] != "view":
                labels.append("act")
                produced |= names
            else:
                labels.append("verify" if names & produced else "inspect")
            continue
        if WRITE.search(cmd):
            labels.append("act")
            produced |= _written_files(cmd)
            continue
        mentioned = {t.lstrip("./") for t in FILE_TOKEN.findall(cmd)}
        if CHECK.search(cmd) or (produced and mentioned & produced):
            labels.append("verify")
        else:
            labels.append("inspect")
    return labels


def _program(command: str) -> str:
    words = command.strip().split()
    return words[0] if words else ""


def last_act(r: Rollout) -> Step | None:
    """The last command that changed something (else the last command): a flag's evidence."""
    shell = shell_steps(r)
    acts = [s for s, lab in zip(shell, label_steps(shell)) if lab == "act"] or r.steps
    return acts[-1] if acts else None


def assess(r: Rollout) -> Quality:
    steps = r.steps
    labels = label_steps(shell_steps(r))
    acts = [i for i, lab in enumerate(labels) if lab == "act"]
    inspects = [i for i, lab in enumerate(labels) if lab == "inspect"]
    verified = 0
    for n, i in enumerate(acts):
        nxt = acts[n + 1] if n + 1 < len(acts) else len(labels)
        verified += any(labels[j] == "verify" for j in range(i + 1, nxt))
    seen: dict[str, int] = {}
    for s in steps:
        seen[s.command.strip()] = seen.get(s.command.strip(), 0) + 1
    errors = [i for i, s in enumerate(steps) if s.exit_code != 0]
    recoveries = sum(1 for i in errors if any(steps[j].exit_code == 0 and _program(steps[j].command) ==
                                              _program(steps[i].command) for j in range(i + 1, len(steps))))
    return Quality(
        labels=labels, inspect_steps=len(inspects), act_steps=len(acts),
        verify_steps=labels.count("verify"),
        inspect_before_act=bool(inspects) and (not acts or inspects[0] < acts[0]),
        act_verify_share=round(verified / len(acts), 4) if acts else 0.0,
        ends_with_verify=bool(labels) and labels[-1] == "verify",
        repeated_commands=sum(n - 1 for n in seen.values()),
        failed_commands=len(errors), recoveries=recoveries, leftover_processes=r.leftover_processes,
        turns=r.turns, completion_tokens=r.completion_tokens, wall_s=r.wall_s)
