"""Recorded trajectories users already have: JSONL or Parquet, one trajectory per row/line.

Accepted row shapes (an environment is named by `env_id`, or by `env`/`task` as a task folder):
- `{"env_id": ..., "commands": ["ls", "cat x"]}`
- `{"env_id": ..., "messages": [OpenAI chat messages]}`: the commands are the `bash` tool calls of
  the assistant turns (arguments `{"command": ...}`), or the first fenced ```bash block of an
  assistant turn without tool calls. For a `tools` environment (`tool_commands`) every other tool call
  but `submit` is kept too, as the server's one-shot command (`call_command`, tasks/envs/tools/spec.py):
  the replay teacher turns it back into the same tool call.
Optional: `trajectory_id` (default: file name + row number), `teacher`, `sample`.

A bad row is a reject with a reason code (`bad_json`, `no_env`, `bad_commands`, `bad_messages`,
`no_commands`); the other rows load. Nothing here raises on row content.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fsspec

from ...schemas.common import Reject
from ..envs.tools.spec import NAME, call_command

FENCE = re.compile(r"```(?:bash|sh|shell)?\s*\n(.*?)```", re.S)


@dataclass
class Recorded:
    trajectory_id: str
    env_id: str
    commands: list[str]
    teacher: str = "recorded"
    sample: int = 0
    messages: list[dict[str, Any]] | None = field(default=None, repr=False)
    tool_commands: list[str] | None = None  # for a `tools` environment (None: same as `commands`)


def commands_from_messages(messages: Any, tools: bool = False) -> list[str]:
    """The shell commands an OpenAI-format conversation executed, in order; with `tools`, its other
    tool calls (but `submit`) too, as `call_command` lines. Raises ValueError."""
    if not isinstance(messages, list):
        raise ValueError("`messages` is not a list")
    out: list[str] = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m:
            raise ValueError(f"messages[{i}] is not a chat message")
        if m["role"] != "assistant":
            continue
        calls = m.get("tool_calls") or []
        if calls:
            for c in calls:
                fn = (c or {}).get("function") or {}
                name = fn.get("name")
                # a name no tool can have (not an identifier) was a call error: nothing to replay
                if name != "bash" and not (tools and isinstance(name, str) and name != "submit" and NAME.match(name)):
                    continue
                try:
                    args = json.loads(fn.get("arguments") or "{}")
                except ValueError:
                    raise ValueError(f"messages[{i}]: tool call arguments are not JSON") from None
                if name == "bash" and isinstance(args, dict) and isinstance(args.get("command"), str):
                    out.append(args["command"])
                elif name != "bash" and isinstance(args, dict):
                    out.append(call_command(name, args))
        elif isinstance(m.get("content"), str):
            blocks = FENCE.findall(m["content"])
            if blocks:
                out.append(blocks[0].strip())
    return out


def _rows(path: str) -> list[tuple[int, Any]]:
    """(line or row number, raw row) pairs; a JSONL line that is not JSON yields its error text."""
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        with fsspec.open(path, "rb") as f:
            return list(enumerate(pq.read_table(f).to_pylist(), start=1))
    rows: list[tuple[int, Any]] = []
    with fsspec.open(path, "r") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rows.append((n, json.loads(line)))
            except ValueError as err:
                rows.append((n, err))
    return rows


def parse_row(row: Any, default_id: str) -> tuple[Recorded | None, Reject | None]:
    if isinstance(row, Exception):
        return None, Reject(key=default_id, reason="bad_json", detail=str(row)[:300])
    if not isinstance(row, dict):
        return None, Reject(key=default_id, reason="bad_json", detail=f"a row must be an object, got {type(row).__name__}")
    tid = str(row.get("trajectory_id") or default_id)
    env_id = row.get("env_id") or row.get("env") or row.get("task")
    if not isinstance(env_id, str) or not env_id:
        return None, Reject(key=tid, reason="no_env", detail="no `env_id` (or `env`/`task`) field")
    messages = row.get("messages")
    if row.get("commands") is not None:
        cmds = row["commands"]
        if isinstance(cmds, str):
            try:
                cmds = json.loads(cmds)
            except ValueError:
                pass
        if not isinstance(cmds, list) or not all(isinstance(c, str) for c in cmds):
            return None, Reject(key=tid, reason="bad_commands",
                                detail=f"`commands` must be a list of strings, got {type(cmds).__name__}")
    elif messages is not None:
        if isinstance(messages, str):
            try:
                messages = json.loads(messages)
            except ValueError:
                return None, Reject(key=tid, reason="bad_messages", detail="`messages` text is not JSON")
        try:
            cmds = commands_from_messages(messages)
        except ValueError as err:
            return None, Reject(key=tid, reason="bad_messages", detail=str(err))
    else:
        return None, Reject(key=tid, reason="no_commands", detail="neither `commands` nor `messages`")
    sample = row.get("sample")
    tool_cmds = commands_from_messages(messages, tools=True) if row.get("commands") is None else None
    return Recorded(tid, env_id, cmds, str(row.get("teacher") or "recorded"),
                    int(sample) if isinstance(sample, int) else 0,
                    messages if isinstance(messages, list) else None, tool_cmds), None


def load_recorded(path: str) -> tuple[list[Recorded], list[Reject]]:
    """Parse a trajectories file; raises ValueError only when the file itself cannot be read."""
    if not fsspec.core.url_to_fs(path)[0].exists(path):
        raise ValueError(f"{path}: trajectories file not found")
    try:
        rows = _rows(path)
    except Exception as err:  # unreadable Parquet, bad encoding...
        raise ValueError(f"{path}: cannot read trajectories ({err.__class__.__name__}: {err})") from None
    name = Path(path).name
    records, rejects = [], []
    for n, row in rows:
        rec, rej = parse_row(row, f"{name}:{n}")
        if rec:
            records.append(rec)
        else:
            rejects.append(rej)
    return records, rejects
