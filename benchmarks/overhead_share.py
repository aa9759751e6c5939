"""Benchmark `overhead_share` (performance target: share of a 100-environment replay build's wall time spent
outside containers and teacher calls ≤ 15%).

Runs `trajforge build` (the CLI, as a user does) on configs/envs100.yaml with the replay teacher, one
sample per environment, into a fresh runs folder, then reads every shard's `_done` marker
(`started_at`, `finished_at`). Inside = shards of the stages whose work is containers and teacher
calls (synthesize: image builds and validation; rollout: episodes and in-place tests; verify:
sibling replays); everything else is outside: process and Prefect start, the Dask cluster, planning,
gates, manifests, and the pure-Python stages (propose, calibrate, export). Python inside those
shards (the harness, Parquet writes) counts as inside: the figure is a lower bound on overhead.
Outside share = 1 − |union of inside shard intervals| / wall.

Usage: python benchmarks/overhead_share.py [--quick]    (quick: 4 environments of the same config)
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import add_quick, host_report, print_table, target  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
INSIDE = ("synthesize", "rollout", "verify")


def union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_quick(ap, "4 environments: 2 families x 2 levels, one seed")
    args = ap.parse_args()
    host_report("start", args.quick)
    runs = tempfile.mkdtemp(prefix="tf-overhead-")
    cfg = yaml.safe_load((ROOT / "configs" / "envs100.yaml").read_text())
    cfg.update(runs=runs, dataset="overhead")
    if args.quick:
        cfg["synthesize"]["families"] = [{"name": f["name"], "levels": [1, 2], "seeds": [0]}
                                         for f in cfg["synthesize"]["families"][:2]]
    cfg["rollout"] = {"samples_per_env": 1, "episodes_per_shard": 25, "concurrency": 8}
    cfg["verify"] = {"concurrency": 4, "rollouts_per_shard": 25}
    path = Path(runs) / "overhead.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {**os.environ}
    env.pop("PREFECT_API_URL", None)
    t0 = time.time()
    out = subprocess.run([str(Path(sys.executable).parent / "trajforge"), "build", str(path)], env=env,
                         capture_output=True, text=True)
    t1 = time.time()
    if out.returncode != 0:
        print(out.stdout[-2000:], out.stderr[-3000:])
        return 1  # broken: the build failed
    # build folders only (`latest` links to the same one)
    markers = [json.loads(Path(p).read_text()) | {"stage": p.split("/")[-4]}
               for p in glob.glob(f"{runs}/overhead/2*/*/*/_done/*")]
    intervals = [(m["started_at"], m["finished_at"]) for m in markers if m["stage"] in INSIDE]
    inside = union(intervals)
    first = min(m["started_at"] for m in markers)
    rows = []
    for stage in ("propose", "synthesize", "rollout", "verify", "calibrate", "export"):
        iv = [(m["started_at"], m["finished_at"]) for m in markers if m["stage"] == stage]
        if iv:
            rows.append([stage, str(len(iv)), f"{union(iv):.1f}", "inside" if stage in INSIDE else "outside"])
    wall = t1 - t0
    n = sum(len(f["levels"]) * len(f["seeds"]) for f in cfg["synthesize"]["families"])
    print_table(f"overhead_share: {n}-environment replay build (trajforge build, 1 sample each, images cached)",
                ["stage", "shards", "shard work s (union)", "counted"], rows)
    print(f"wall {wall:.1f}s · shard work {inside:.1f}s · outside {wall - inside:.1f}s = "
          f"{(wall - inside) / wall:.0%} of the build (target ≤ 15%); "
          f"of which before the first shard (process, Prefect API, cluster): {first - t0:.1f}s")
    code = target("share of the build's wall time outside containers and teacher calls", (wall - inside) / wall,
                  "<=", 0.15, args.quick, peer=f"shard work {inside:.1f}s of {wall:.1f}s")
    host_report("end")
    return code


if __name__ == "__main__":
    sys.exit(main())
