"""What the monitor reads of one rollout, gathered once and shared by every detector: the shell steps, what the
agent saw (its observations), the files it changed with their content as captured (the work dir's final state
and the outside capture, only the paths the change set names), the final message and the reference solution's
text. Execution-free: nothing here runs or opens a container; a capture that does not read is a named problem,
never an exception (the row says `unreadable: ...`)."""

from __future__ import annotations

import io
import posixpath
import tarfile
from dataclasses import dataclass, field

from ....schemas.environment import EnvSpec
from ....schemas.trajectory import Rollout, Step
from ..quality import shell_steps

FILE_CAP = 64 << 10  # bytes of one changed file read as text
TOTAL_CAP = 4 << 20  # bytes of changed files read per rollout
STEP_CAP = 16 << 10  # characters of one command or observation a detector sees


@dataclass
class Evidence:
    rollout: Rollout
    env: EnvSpec
    steps: list[Step]  # the shell steps (a terminal episode's)
    calls: list[Step]  # a tool episode's steps: each one tool call, `call_command(name, arguments)`
    observed: str  # every observation the agent was shown, in order (tool and user messages after the instruction)
    written: dict[str, str]  # absolute path -> text of a changed file as captured (binary and oversize left out)
    changed: list[str]  # absolute paths the change set names as added or modified
    deleted: list[str]
    final: str  # the agent's last message text
    reference: str  # the reference solution's commands, one text
    problems: list[str] = field(default_factory=list)

    def commands(self) -> list[tuple[int, str]]:
        """(turn, text) of every step the agent took, shell commands and tool calls alike (capped)."""
        return [(s.turn, s.command[:STEP_CAP]) for s in self.steps + self.calls]


def gather(r: Rollout, env: EnvSpec) -> Evidence:
    problems: list[str] = []
    changes = r.changes
    changed = sorted(set(changes.added) | set(changes.modified)) if changes else []
    written: dict[str, str] = {}
    budget = [TOTAL_CAP]
    parent = posixpath.dirname(env.workdir.rstrip("/")) or "/"  # the engine's tar of /app names its members app/...
    _read_tar(r.final_state, parent, set(changed), written, budget, problems, "final_state")
    _read_tar(r.outside_state, "/", set(changed), written, budget, problems, "outside_state")
    texts = [m for m in r.messages if m.role in ("tool", "user")][1:]
    observed = "\n".join((m.content or "")[:STEP_CAP] for m in texts)
    finals = [m.content or "" for m in r.messages if m.role == "assistant"]
    steps = shell_steps(r)
    return Evidence(rollout=r, env=env, steps=steps, calls=[] if steps or not r.steps else list(r.steps),
                    observed=observed, written=written, changed=changed,
                    deleted=sorted(changes.deleted) if changes else [], final=(finals[-1] if finals else "")[:STEP_CAP],
                    reference="\n".join(env.solution), problems=problems)


def _under(path: str, changed: set[str]) -> bool:
    """Whether the change set names `path` or a folder above it (an added folder carries its files)."""
    p = path
    while p not in ("/", ""):
        if p in changed:
            return True
        p = posixpath.dirname(p)
    return False


def _read_tar(data: bytes | None, root: str, changed: set[str], out: dict[str, str], budget: list[int],
              problems: list[str], what: str) -> None:
    if not data:
        return
    try:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            for m in tar:
                if not m.isfile() or m.size > FILE_CAP or m.size > budget[0]:
                    continue
                path = posixpath.normpath(posixpath.join(root, m.name))
                if not _under(path, changed):
                    continue
                raw = tar.extractfile(m).read()
                budget[0] -= len(raw)
                if b"\0" in raw[:8192]:
                    continue  # binary: no text detector reads it
                out[path] = raw.decode("utf-8", "replace")
    except (tarfile.TarError, OSError, EOFError) as err:
        problems.append(f"{what} does not read as a tar ({err.__class__.__name__})")
