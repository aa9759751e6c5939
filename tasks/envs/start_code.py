"""Environments whose own start-up runs files the agent writes: a validator mark (`EnvSpec.tests_run_agent_code`
value `environment`).

An image's ENTRYPOINT runs on every start of its container and a HEALTHCHECK runs periodically, both as the
image's user, usually root. When their programs read a path the agent writes (a work-dir `.env` the entrypoint
sources, a config a service loads, a file the reference solution changes), the environment runs agent-written
files outside the hidden tests: during the episode with root's powers, and again on any restart. trajforge's
judging never starts either after the episode (tasks/sandbox/fresh.py: a new container of the episode's commit,
trajforge's entrypoint, no healthcheck), so such a task is still judged; the mark tells the dataset's users, like
the tests' own marks, and is exported in the `tests_run_agent_code` column (filter on it).

What is read: the ENTRYPOINT and HEALTHCHECK argv and the text of every absolute file path among them (read through
the engine, at most 1 MiB each); a path the reference solution changes (`EnvSpec.expected_changes`) or a path in the
work dir named there marks the environment.
"""

from __future__ import annotations

import re

from ...schemas.environment import EnvSpec
from ..sandbox import Sandbox, SandboxError

MARK = "environment"
PATH = re.compile(r"(?<![\w.-])/[\w.@+-]+(?:/[\w.@+-]+)*")
TEXT_LIMIT = 1 << 20


def start_argv(sb: Sandbox) -> list[str]:
    """The image's ENTRYPOINT and HEALTHCHECK argv (its container's config), without Docker's `CMD`/`CMD-SHELL` word."""
    conf = sb.container.attrs.get("Config") or {}
    check = (conf.get("Healthcheck") or {}).get("Test") or []
    return list(conf.get("Entrypoint") or []) + (check[1:] if check[:1] in (["CMD"], ["CMD-SHELL"]) else [])


def agent_files_read(sb: Sandbox, env: EnvSpec) -> list[str]:
    """The paths the image's start-up code names that the agent writes (the reference's changes, the work dir)."""
    argv = start_argv(sb)
    if not argv:
        return []
    texts = [" ".join(argv)]
    for word in argv:
        for path in PATH.findall(word):
            if sb.path_kind(path) == "file":
                try:
                    texts.append(sb.get_archive_file(path, TEXT_LIMIT).decode("utf-8", errors="replace"))
                except SandboxError:
                    continue
    root = env.workdir.rstrip("/") + "/"
    named = {p for text in texts for p in PATH.findall(text)}
    changed = set(env.expected_changes)
    return sorted(p for p in named if p in changed or p.startswith(root))


def mark(sb: Sandbox, env: EnvSpec, tests_mark: str) -> str:
    """`tests_mark` (the tests' own exposure), or `environment` when the tests run none of the agent's code but the
    environment's start-up reads files the agent writes."""
    if tests_mark != "no":
        return tests_mark
    return MARK if agent_files_read(sb, env) else tests_mark
