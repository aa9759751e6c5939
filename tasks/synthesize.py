"""Stage `synthesize`: admit the proposed environments. Near-duplicates are found over all candidates
(MinHash over instruction and files, `synthesize.dedup_threshold`; procedural sources come first): of
each group of near-duplicates the first that passes validation is kept and the others are rejected as
`near_duplicate` of it (a broken or unbuildable copy never knocks out a good one; the next in order is
checked only when the one before it was rejected). Then each image is built once (content-addressed, `build_concurrency` at a time) and the validator
runs every check in Docker (see `validator`). Kept rows carry their image tag; each rejected
candidate is a row of `rejects` with its reason code; `stats.json` has the yield per source
(`yield`: `source|outcome`), the kept environments by oracle (`kept_by_oracle`: `source|present` /
`source|absent`) and failed builds by cause (`build_failures`). Environments without a reference
solution are kept (marked `oracle: absent`) unless `synthesize.require_solution` (then
`no_reference_solution`). Each build's log is kept per image under `synthesize.build.log_dir`, else
`<build>/build-logs/<tag>.log` in the run store. `stats.json`'s `audit` is the test audit's cost and yield:
environments audited, test runs, seconds, weak (kept with `synthesize.audit: flag`, else rejected
`weak_tests`) and skipped (no reference solution); `test_strength` counts them per strength bucket.
"""

from __future__ import annotations

import contextlib
import posixpath
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..schemas.common import Reject
from ..schemas.config import BuildConfig, fingerprint_view
from ..schemas.environment import EnvSpec
from .engine import Manifest, Retryable, Shard, ShardResult, Stage, StageContext
from .envs import validations
from .envs.catalogue import merge_candidates, source_kind, source_priority
from .envs.images import BuildOptions, ImageBuildError, ensure_image
from .envs.registry import lookup, push
from .envs.validator import dedup, validate_configured
from .sandbox import SandboxError, docker_client

ADMISSION = ("image_aliases", "dedup_threshold", "validate_envs", "solution_timeout_s", "test_timeout_s",
             "envs_per_shard", "require_solution", "build", "audit", "audit_mutants")


def strength_bucket(strength: float | None) -> str:
    """The report's bucket of a test strength (killed / tried mutants)."""
    if strength is None:
        return "not audited"
    return "1.0" if strength >= 1 else "0.75-1" if strength >= 0.75 else "0.5-0.75" if strength >= 0.5 else "0-0.5"


def build_options(s) -> BuildOptions:
    """`synthesize.build` as the image builder's options (the host's CA bundle unless one is set)."""
    return BuildOptions.from_config(s.build)


class SynthesizeStage(Stage):
    name = "synthesize"
    requires = ("propose",)
    services = ("sandboxes",)  # the validator runs each candidate in Docker
    config_sections = ("synthesize", "sandbox")
    output = EnvSpec

    def retryable(self, rows, rejects: list[Reject]) -> Retryable:
        """`validation_infra` rejects (Docker failed while checking an environment): never final; their
        shard runs again (an environment's checks are cheap next to an episode's)."""
        at = [i for i, r in enumerate(rejects) if r.reason == "validation_infra"]
        return Retryable(rejects=at, errors=[f"{rejects[i].key}: {rejects[i].detail[:300]}" for i in at[:3]])

    def config_section(self, config: BuildConfig) -> dict[str, Any]:
        s = fingerprint_view(config.synthesize)
        return {"synthesize": {k: s[k] for k in ADMISSION if k in s}, "sandbox": fingerprint_view(config.sandbox)}

    def plan(self, ctx: StageContext, upstream: dict[str, Manifest]) -> list[Shard]:
        cands = ctx.store.read_records(upstream["propose"].parts, EnvSpec)
        cands.sort(key=lambda e: (source_priority(e.source), e.env_id))
        # the same content proposed twice (by two propose shards) is one candidate; another content under an
        # id already seen is an `env_id_conflict` (the higher-priority source kept, its content pinned)
        unique, conflicts = merge_candidates(cands)
        dups = {}
        threshold = ctx.config.synthesize.dedup_threshold
        if threshold is not None:
            dups = dedup(unique, threshold)
        keep = [e.env_id for e in unique if e.env_id not in dups]
        n = ctx.config.synthesize.envs_per_shard
        shards = [Shard(index=i, payload={"env_ids": keep[j:j + n], "duplicates": {}})
                  for i, j in enumerate(range(0, len(keep), n))]
        home = {env_id: shard for shard in shards for env_id in shard.payload["env_ids"]}
        for env in unique:  # a near-duplicate travels with the first of its group: its stand-in if that fails
            if env.env_id in dups:
                home[dups[env.env_id]].payload["duplicates"][env.env_id] = dups[env.env_id]
        if conflicts:  # the rejects of conflicting ids travel with the first shard
            if not shards:
                shards = [Shard(index=0, payload={"env_ids": [], "duplicates": {}})]
            shards[0].payload["conflicts"] = [r.model_dump(mode="json") for r in conflicts]
            kept = {e.env_id: e for e in unique}
            for shard in shards:
                mine = set(shard.payload["env_ids"]) | set(shard.payload["duplicates"])
                shard.payload["contents"] = {r.key: kept[r.key].content_hash() for r in conflicts if r.key in mine}
        return shards

    def run_shard(self, ctx: StageContext, shard: Shard, upstream: dict[str, Manifest]) -> ShardResult:
        cfg = ctx.config
        s = cfg.synthesize
        wanted = set(shard.payload["env_ids"]) | set(shard.payload["duplicates"])
        pinned = shard.payload.get("contents", {})  # an id proposed with two contents: the one plan kept
        cands = {e.env_id: e for e in ctx.store.read_records(upstream["propose"].parts, EnvSpec)
                 if e.env_id in wanted and (e.env_id not in pinned or e.content_hash() == pinned[e.env_id])}
        client = docker_client(pool_size=2 * s.build_concurrency + 4, sandbox=cfg.sandbox)
        stats: dict[str, Any] = {"images_built": 0, "images_pushed": 0, "validation_seconds": 0.0, "yield": {},
                                 "kept_by_oracle": {}, "build_failures": {}, "audit": {
                                     "envs": 0, "test_runs": 0, "seconds": 0.0, "weak": 0, "skip": 0},
                                 "test_strength": {}}
        rows, rejects = [], []
        options = build_options(s)
        logs = s.build.log_dir or posixpath.join(ctx.store.build_dir(ctx.build_id), "build-logs")

        def keep_log(tag: str, text: str) -> None:
            name = tag.split(":")[-1] + ".log"
            if s.build.log_dir:
                Path(logs).mkdir(parents=True, exist_ok=True)
                (Path(logs) / name).write_text(text)
            else:
                ctx.store.write_text(posixpath.join(logs, name), text)

        def count(env: EnvSpec, outcome: str) -> None:
            key = f"{source_kind(env.source)}|{outcome}"
            stats["yield"][key] = stats["yield"].get(key, 0) + 1

        group: dict[str, list[str]] = {}  # first of a near-duplicate group -> the others, in plan order
        for env_id, original in shard.payload["duplicates"].items():
            group.setdefault(original, []).append(env_id)
        rejects += [Reject(**r) for r in shard.payload.get("conflicts", [])]

        def one(env: EnvSpec):
            if env.oracle == "absent" and s.require_solution:
                return env, Reject(key=env.env_id, reason="no_reference_solution",
                                   detail="the task ships no reference solution (synthesize.require_solution)"), False, 0.0
            if not s.validate_envs:
                try:
                    env.image, built = ensure_image(client, cfg.sandbox.base_image, env, s.image_aliases,
                                                   limits=cfg.sandbox, options=options, log_sink=keep_log)
                    return env, None, built, 0.0
                except ImageBuildError as err:
                    return env, Reject(key=env.env_id, reason="image_build_failed",
                                       detail=f"[{err.cause}] {err.log_tail[-1500:]}"), False, 0.0
            if s.reuse_validations and (known := _recalled(env)) is not None:
                return known, None, False, 0.0
            try:
                v = validate_configured(client, env, s, cfg.sandbox, build=options, log_sink=keep_log,
                                        labels={"trajforge.build": ctx.build_id})
            except SandboxError as err:  # e.g. the base image is missing: not this environment's fault
                return env, Reject(key=env.env_id, reason="validation_infra", detail=str(err)[:1500]), False, 0.0
            if v.reject is None and s.reuse_validations:
                with contextlib.suppress(Exception):  # recording is only a later saving
                    validations.record(validations.key(env, client.images.get(env.image).id, code, settings), env)
            return env, v.reject, v.built, v.seconds

        code, settings = self.code_version(), self.config_section(cfg)
        reused: set[str] = set()

        def _recalled(env: EnvSpec) -> EnvSpec | None:
            """The environment as a validation of the same inputs kept it (tasks/envs/validations.py), else None
            (then it is validated: an image that does not build or an engine that fails is the validator's to say)."""
            try:
                image, _ = ensure_image(client, cfg.sandbox.base_image, env, s.image_aliases, limits=cfg.sandbox,
                                        options=options, log_sink=keep_log)
                image_id = client.images.get(image).id
            except Exception:  # noqa: BLE001 - the validator meets the same fault and names it
                return None
            known = validations.recall(validations.key(env, image_id, code, settings), env)
            if known is not None:
                known.image = image
                reused.add(env.env_id)
            return known

        registry = cfg.sandbox.registry

        def one_and_push(env: EnvSpec):
            env, reject, built, seconds = one(env)
            pushed = reject is None and bool(registry) and lookup(ctx.store, registry, env.image) is None
            if pushed:  # built once, here: every other engine pulls it by this digest
                push(client, env.image, registry, ctx.store)
            return env, reject, built, seconds, pushed

        def first_valid(env_id: str) -> list[tuple]:
            """The group's members in order until one is kept (or Docker fails: the shard runs again); the
            rest are near duplicates of the one kept (of the first, if none was)."""
            tried = []
            members = [env_id, *group.get(env_id, [])]
            for member in members:
                tried.append(one_and_push(cands[member]))
                reject = tried[-1][1]
                if reject is None or reject.reason == "validation_infra":
                    break
            kept = tried[-1][0].env_id if tried[-1][1] is None else env_id
            return tried + [(cands[m], Reject(key=m, reason="near_duplicate", detail=f"nearly the same as {kept}"),
                             False, 0.0, False) for m in members[len(tried):]]

        with ThreadPoolExecutor(s.build_concurrency) as pool:
            results = [r for rs in pool.map(first_valid, shard.payload["env_ids"]) for r in rs]
            for env, reject, built, seconds, pushed in results:
                stats["images_built"] += int(built)
                stats["images_pushed"] += int(pushed)
                stats["validation_seconds"] += seconds
                if env.env_id in reused and reject is None:  # a kept validation read back: no cost spent here
                    stats["validations_reused"] = stats.get("validations_reused", 0) + 1
                elif env.audit.status in ("strong", "weak", "skip"):  # the test audit's cost (tasks/envs/audit.py)
                    a = stats["audit"]
                    a["envs"] += env.audit.status != "skip"
                    a["test_runs"] += env.audit.test_runs
                    a["seconds"] = round(a["seconds"] + env.audit.seconds, 3)
                    a["weak"] += env.audit.status == "weak"
                    a["skip"] += env.audit.status == "skip"
                if env.audit.status in ("strong", "weak", "skip"):
                    bucket = strength_bucket(env.audit.strength)
                    stats["test_strength"][bucket] = stats["test_strength"].get(bucket, 0) + 1
                if reject:
                    rejects.append(reject)
                    count(env, reject.reason)
                    if reject.reason == "image_build_failed":
                        cause = reject.detail[1:].partition("]")[0] if reject.detail.startswith("[") else "build_step_failed"
                        stats["build_failures"][cause] = stats["build_failures"].get(cause, 0) + 1
                else:
                    rows.append(env)
                    count(env, "kept")
                    key = f"{source_kind(env.source)}|{env.oracle}"
                    stats["kept_by_oracle"][key] = stats["kept_by_oracle"].get(key, 0) + 1
        return ShardResult(rows, rejects, stats)
