"""Stage `propose`: candidate environments from every source, before any image is built.

Sources (config `synthesize`): procedural `families` (family x level x seed), task folders in
`imports` (Harbor or Terminal-Bench 1.x), and `llm` themes written by the teacher (terminal tasks for
`themes`, tool environments for `tool_themes`). A candidate
that cannot be read is a reject with its reason (`import_malformed`, `llm_*`, `teacher_error`); the
others go on to `synthesize`, which removes near-duplicates and validates each in Docker.
Invariant: a candidate's env_id names one content: the same source gives the same id, and two candidates
with one id but different content (a Harbor folder trajforge exported keeps its recorded id, and a
recorded id is a claim anyone can write) are never merged silently: the later one is an
`env_id_conflict` reject naming both sources.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from ..schemas.common import Reject
from ..schemas.config import BuildConfig
from ..schemas.environment import EnvSpec
from .engine import Manifest, Shard, ShardResult, Stage, StageContext
from .envs.catalogue import merge_candidates
from .envs.families import get_family
from .envs.formats import TaskFormatError, find_tasks, folder_digest, import_task, markers
from .envs.repos.source import repo_fingerprint, repo_items, run_repo_items


def procedural_items(config: BuildConfig) -> list[dict[str, Any]]:
    items = []
    for f in config.synthesize.families:
        fam = get_family(f.name)
        for level in f.levels:
            if level not in fam.levels:
                raise ValueError(f"synthesize.families: {fam.name} has levels {list(fam.levels)}, not {level}")
            items += [{"kind": "family", "family": f.name, "level": level, "seed": s} for s in f.seeds]
    return items


def import_items(config: BuildConfig) -> list[dict[str, Any]]:
    items = []
    for root in config.synthesize.imports:
        try:
            folders = find_tasks(Path(root))
        except TaskFormatError as err:
            raise ValueError(f"synthesize.imports: {err}") from None
        if not folders:
            raise ValueError(f"synthesize.imports: no task folder ({markers()}) under {root}")
        items += [{"kind": "import", "path": str(p)} for p in folders]
    return items



class ProposeStage(Stage):
    name = "propose"
    config_sections = ("synthesize",)
    output = EnvSpec

    def services_for(self, config: BuildConfig) -> tuple[str, ...]:
        s = config.synthesize
        teacher = bool(s.llm) or any(r.issue_text == "teacher" for r in s.repos)
        return (("teacher",) if teacher else ()) + (("sandboxes",) if s.repos else ())

    def config_section(self, config: BuildConfig) -> dict[str, Any]:
        s = config.synthesize
        out: dict[str, Any] = {"families": [f.model_dump(mode="json") for f in s.families],
                               "imports": {p: folder_digest(Path(p)) for p in s.imports if Path(p).exists()},
                               # an empty `tool_themes` is left out: configs written before it keep their fingerprint
                               "llm": s.llm.model_dump(mode="json", exclude=None if s.llm.tool_themes else {"tool_themes"})
                               if s.llm else None,
                               "envs_per_shard": s.envs_per_shard}
        if s.llm:
            out["teacher"] = config.teacher.fingerprint()
        if s.repos:  # left out when empty: configs written before it keep their fingerprint
            out["repos"] = repo_fingerprint(config)
        return out

    def progress_text(self, totals: dict[str, Any], elapsed_s: float) -> str:
        if not totals.get("repo_tasks"):
            return ""
        return f"repository tasks {totals.get('repo_done', 0)}/{totals['repo_tasks']} · kept {totals.get('repo_kept', 0)}"

    def plan(self, ctx: StageContext, upstream: dict[str, Manifest]) -> list[Shard]:
        cfg = ctx.config.synthesize
        items = procedural_items(ctx.config) + import_items(ctx.config) + repo_items(ctx.config)
        if cfg.llm:
            items += [{"kind": "llm", "theme": t, "index": i}
                      for t in cfg.llm.themes for i in range(cfg.llm.candidates_per_theme)]
            items += [{"kind": "llm_tools", "theme": t, "index": i}
                      for t in cfg.llm.tool_themes for i in range(cfg.llm.candidates_per_theme)]
        n = cfg.envs_per_shard
        return [Shard(index=i, payload={"items": items[j:j + n]}) for i, j in enumerate(range(0, len(items), n))]

    def run_shard(self, ctx: StageContext, shard: Shard, upstream: dict[str, Manifest]) -> ShardResult:
        rows: list[EnvSpec] = []
        rejects: list[Reject] = []
        llm_items = []
        repo_rows, repo_rejects = run_repo_items(ctx, [it for it in shard.payload["items"] if it["kind"] == "repo"])
        rows += repo_rows
        rejects += repo_rejects
        for it in shard.payload["items"]:
            if it["kind"] == "repo":
                continue
            if it["kind"] == "family":
                rows.append(get_family(it["family"]).generate(it["level"], it["seed"]))
            elif it["kind"] == "import":
                try:
                    rows.append(import_task(Path(it["path"])))
                except TaskFormatError as err:
                    rejects.append(Reject(key=it["path"], reason="import_malformed", detail=str(err)))
            else:
                llm_items.append(it)
        if llm_items:
            results = asyncio.run(self._llm(ctx, llm_items))
            for env, reject in results:
                if env is not None:
                    rows.append(env)
                else:
                    rejects.append(reject)
        by_source: dict[str, int] = {}
        for e in rows:
            by_source[e.source] = by_source.get(e.source, 0) + 1
        kept, conflicts = merge_candidates(rows)
        return ShardResult(kept, rejects + conflicts, {"candidates": by_source})

    async def _llm(self, ctx: StageContext, items: list[dict]) -> list:
        from .envs.synthesis.terminal import propose
        from .envs.synthesis.tools import propose_tools
        from .teachers import make_teacher

        llm = ctx.config.synthesize.llm
        tcfg = ctx.config.teacher.model_copy(update={"max_tokens": llm.max_tokens, "temperature": llm.temperature,
                                                     "tool_calling": False, "return_token_ids": False,
                                                     "logprobs": False})
        teacher = make_teacher(tcfg, ctx.runtime, ctx.limiter)
        try:
            return await asyncio.gather(*((propose_tools if it["kind"] == "llm_tools" else propose)(
                teacher, it["theme"], it["index"]) for it in items))
        finally:
            await teacher.aclose()
