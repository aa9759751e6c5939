"""The `synthesize.repos` source (issue 43), as the `propose` stage uses it: `repo_items` (plan: the tasks each
repository tries, `plan.items`), `run_repo_items` (a shard: each item's image built and suite run in Docker,
`make.make_env`, giving an environment or a reject with its reason) and `repo_fingerprint` (what the stage's
fingerprint hashes: each repository's config and the commit its history ends at).

Invariants: items are JSON (a shard carries them; resume is per shard, as for every stage); an item's outcome
depends only on the repository, its config and the base image, so a shard that runs again gives the same rows;
Docker failing raises (`SandboxError`: the shard fails and a later run retries it), never a reject.
"""

from __future__ import annotations

import posixpath
from typing import Any

from ....schemas.common import Reject
from ....schemas.config import BuildConfig
from ....schemas.environment import EnvSpec
from ...engine import StageContext
from ...sandbox import docker_client
from ..images import BuildOptions
from .fetch import repository_path
from .history import open_repository
from .make import make_env
from .plan import items


def repo_items(config: BuildConfig) -> list[dict[str, Any]]:
    """Every repository's items, in config order."""
    return [it for i, cfg in enumerate(config.synthesize.repos) for it in items(i, cfg)[0]]


def repo_fingerprint(config: BuildConfig) -> list[dict[str, Any]]:
    """Each repository's config, and the commit its history ends at (a new commit is new input)."""
    out = []
    for cfg in config.synthesize.repos:
        repo = open_repository(repository_path(cfg.path, cfg.pypi, cfg.versions))
        # (`issue_text` left out at its default: configs written before it keep their fingerprint)
        dump = cfg.model_dump(mode="json", exclude={"issue_text"} if cfg.issue_text == "commit" else None)
        out.append({"config": dump, "head": repo.head})
        if cfg.issue_text == "teacher":
            out[-1]["teacher"] = config.teacher.fingerprint()
    return out


def run_repo_items(ctx: StageContext, todo: list[dict[str, Any]]) -> tuple[list[EnvSpec], list[Reject]]:
    """The environments and rejects of a shard's repository items, one at a time (each runs a whole suite)."""
    if not todo:
        return [], []
    cfg = ctx.config
    s = cfg.synthesize
    client = docker_client(pool_size=4, sandbox=cfg.sandbox)
    options = BuildOptions.from_config(s.build)
    logs = posixpath.join(ctx.store.build_dir(ctx.build_id), "build-logs")

    def keep_log(tag: str, text: str) -> None:
        ctx.store.write_text(posixpath.join(logs, tag.split(":")[-1] + ".log"), text)

    rows: list[EnvSpec] = []
    rejects: list[Reject] = []

    def make_teacher():  # for `issue_text: teacher` (a client per request: each runs in its own event loop)
        from ...teachers import make_teacher

        return make_teacher(cfg.teacher.model_copy(update={"tool_calling": False, "return_token_ids": False,
                                                           "logprobs": False}), ctx.runtime, ctx.limiter)

    for done, item in enumerate(todo):
        ctx.report(repo_tasks=len(todo), repo_done=done, repo_kept=len(rows))
        out = make_env(client, item["repo"], s.repos[item["repo"]], item, cfg.sandbox, options, s.image_aliases,
                       log_sink=keep_log, labels={"trajforge.build": ctx.build_id}, make_teacher=make_teacher)
        (rows if isinstance(out, EnvSpec) else rejects).append(out)
    ctx.report(force=True, repo_tasks=len(todo), repo_done=len(todo), repo_kept=len(rows))
    return rows, rejects
