"""Benchmark `repo_envs` (issue 43): environments per minute from one repository on this machine, and the share of
candidates kept and rejected by reason.

The repository is `configs/swe.yaml`'s (more-itertools from its released sdists), read from the trajforge cache
(`make bench` fetches it first with `trajforge envs fetch configs/swe.yaml`; the benchmark itself runs with
`TRAJFORGE_OFFLINE=1`: it reaches no registry); its items (`plan.items`: commit tasks, then planted-bug tasks) are each made into an
environment or a reject by `make.make_env`, one after another as a `propose` shard runs them. Timed per item: the
whole item, its image build (`images.ensure_image`) and its suite runs (`probe.probe`); the rest is reading the
history, planting and writing the task. Printed: a row per kind (items, kept, seconds per item and per phase),
the rejects by reason, and environments per minute (kept environments / wall minutes of the making).

No target is set by the issue for the rate: the figure is for the record. Targets: at least 10 environments kept of
each kind (issue 43's "the real project gives at least 10 validated environments of each kind", before validation).

    python benchmarks/repo_envs.py [--commits N] [--bugs N] [--quick]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import host_report, no_target, parse_quick, print_table, target  # noqa: E402

from trajforge.schemas.common import Reject  # noqa: E402
from trajforge.schemas.config import SandboxConfig, load_config  # noqa: E402
from trajforge.schemas.environment import EnvSpec  # noqa: E402
from trajforge.tasks.envs.images import BuildOptions  # noqa: E402
from trajforge.tasks.envs.repos import make  # noqa: E402
from trajforge.tasks.envs.repos.plan import items  # noqa: E402
from trajforge.tasks.envs.repos.probe import SuiteTooSlow  # noqa: E402
from trajforge.tasks.sandbox import docker_client  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def timed(phases: dict[str, float], name: str, fn):
    """`fn`, its wall seconds added to `phases[name]` on every call."""
    def wrapper(*a, **kw):
        t0 = time.monotonic()
        try:
            return fn(*a, **kw)
        finally:
            phases[name] += time.monotonic() - t0
    return wrapper


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "swe.yaml"))
    ap.add_argument("--commits", type=int, default=None, help="commit tasks tried (default: the config's)")
    ap.add_argument("--bugs", type=int, default=None, help="planted-bug tasks tried (default: the config's)")
    ap.add_argument("--validate", type=int, default=0, help="then validate this many kept environments, timing each "
                                                            "of the validator's checks (the build's validate stage)")
    args = parse_quick(ap, commits=2, bugs=2)
    os.environ["TRAJFORGE_OFFLINE"] = "1"  # the sources come from the cache only
    config = load_config(args.config)
    cfg = config.synthesize.repos[0]
    cfg = cfg.model_copy(update={k: v for k, v in (("commits", args.commits), ("bugs", args.bugs)) if v is not None})
    t0 = time.monotonic()
    todo, skipped = items(0, cfg)  # fetches the sdists and makes the history once (cached)
    print(f"{cfg.label}: {len(todo)} items planned in {time.monotonic() - t0:.1f}s (fetch + history + planting); "
          f"skipped before any build: {dict(skipped) or 'none'}", flush=True)
    sandbox = config.sandbox or SandboxConfig()
    options = BuildOptions.from_config(config.synthesize.build)
    client = docker_client(pool_size=4, sandbox=sandbox)
    per_kind: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    reasons: Counter[str] = Counter()
    kept = 0
    made: list = []
    start = time.monotonic()
    for n, item in enumerate(todo, 1):
        phases = per_kind[item["task"]]
        make.ensure_image = timed(phases, "image", original_image)
        make.probe = timed(phases, "probe", original_probe)
        t = time.monotonic()
        try:
            out = make.make_env(client, 0, cfg, item, sandbox, options, config.synthesize.image_aliases)
        except SuiteTooSlow as err:  # infrastructure: the item is not decided (a build would run it again)
            out = Reject(key=item["task"], reason="infra_suite_too_slow", detail=str(err))
        phases["total"] += time.monotonic() - t
        phases["items"] += 1
        if isinstance(out, EnvSpec):
            kept += 1
            phases["kept"] += 1
            reasons["kept"] += 1
        else:
            reasons[out.reason] += 1
        made.append(out)
        what = "kept" if isinstance(out, EnvSpec) else f"{out.reason}: {out.detail[:160]!r}"
        print(f"  [{n}/{len(todo)}] {item['task']}: {what} ({time.monotonic() - t:.1f}s)", flush=True)
    wall = time.monotonic() - start
    rows = []
    for kind, p in per_kind.items():
        k = max(p["items"], 1)
        rows.append([kind, int(p["items"]), int(p["kept"]), f"{p['total'] / k:.1f}", f"{p['image'] / k:.1f}",
                     f"{p['probe'] / k:.1f}", f"{(p['total'] - p['image'] - p['probe']) / k:.1f}"])
    print_table("per item (wall s)", ["kind", "items", "kept", "s/item", "image", "suite runs", "rest"], rows)
    total = max(sum(reasons.values()), 1)
    print_table("candidates by outcome", ["outcome", "items", "share"],
                [[r, c, f"{c / total:.0%}"] for r, c in reasons.most_common()])
    if args.validate:
        validate_phases([e for e in made if isinstance(e, EnvSpec)][:args.validate], config, sandbox)
    per_min = kept / (wall / 60) if wall else float("nan")
    print(f"environments per minute: {per_min:.2f} ({kept} kept of {len(todo)} items in {wall:.0f}s)")
    host_report("end", args.quick)
    no_target(f"{per_min:.2f} environments/min from {cfg.label}: the issue sets no figure")
    # issue 43: the real project gives at least 10 environments of each kind (with the config's full sample)
    codes = [target(f"{kind} environments kept", per_kind[kind]["kept"] if kind in per_kind else 0, ">=", 10,
                    args.quick) for kind in ("commit", "planted_bug")]
    return max(codes)


def validate_phases(envs: list[EnvSpec], config, sandbox: SandboxConfig) -> None:
    """The validator `trajforge envs from-repo` runs (`flows/envs_settings.validate_all`, the config's settings) on
    `envs`, one after another, with the wall seconds of each check."""
    from dataclasses import replace

    from trajforge.flows.envs_settings import validate_all
    from trajforge.tasks.envs import validator

    spent: dict[str, float] = defaultdict(float)
    original = validator.CHECKS
    validator.CHECKS = tuple(replace(c, run=timed(spent, c.name, c.run)) for c in original)
    t0 = time.monotonic()
    try:
        results = [v for _, v in validate_all([e.model_copy(deep=True) for e in envs], config.synthesize, sandbox, 1)]
    finally:
        validator.CHECKS = original
    wall = time.monotonic() - t0
    n = max(len(envs), 1)
    rows = [[name, f"{sec / n:.1f}", f"{sec / wall:.0%}"] for name, sec in sorted(spent.items(), key=lambda x: -x[1])]
    rows.append(["(image, containers, rest)", f"{(wall - sum(spent.values())) / n:.1f}",
                 f"{(wall - sum(spent.values())) / wall:.0%}"])
    print_table(f"validation of {len(envs)} environments ({sum(v.ok for v in results)} kept, {wall:.0f}s): wall s "
                "per environment by check", ["check", "s/env", "share"], rows)


original_image = make.ensure_image
original_probe = make.probe

if __name__ == "__main__":
    sys.exit(main())
