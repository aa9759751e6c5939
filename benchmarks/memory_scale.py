"""Benchmark `memory_scale` (performance target: driver peak RSS at 10× the rollouts ÷ at 1× ≤ 1.5).

Runs `trajforge build` (the CLI, as a user does: Prefect flow, Dask LocalCluster, real containers)
twice, side by side in one run, each into a fresh runs folder: a replay-teacher build of the same
environments with `samples_per_env` = 2 (1×) and 20 (10×). The replay source is a recorded file:
each environment's reference solution preceded by writing `--payload-kb` of random bytes into the
work dir, so every rollout carries a final state of that size (the 1–8 MiB a real agent's work dir
weighs) and a whole-table read would show. Shards are the same size at both scales
(`episodes_per_shard`, `verify.rollouts_per_shard`): only their number grows.

Peak RSS is the kernel's high-water mark (`VmHWM` in /proc/<pid>/status, polled every 0.2 s until
the process ends) of the driver (the `trajforge build` process: flow, planning, gates, commits,
export's derived configs) and of the largest Dask worker process (shards). The Prefect API server
the build starts is left out (its size does not depend on the data).

Usage: python benchmarks/memory_scale.py [--payload-kb 4096] [--envs-seeds 2] [--scale 10] [--keep] [--quick]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import host_report, parse_quick, print_table, target  # noqa: E402

from trajforge.tasks.envs.families import FAMILIES  # noqa: E402

FAMILY_NAMES = ("log_report", "file_search")
SAMPLES_1X = 2


def hwm_kb(proc: psutil.Process) -> int:
    """Peak resident set of a live process in kB (VmHWM), or its current RSS where /proc has none."""
    try:
        with open(f"/proc/{proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return proc.memory_info().rss // 1024


def role(proc: psutil.Process, root: int) -> str:
    if proc.pid == root:
        return "driver"
    cmd = " ".join(proc.cmdline())
    if "prefect" in cmd or "uvicorn" in cmd:
        return "prefect"
    if "spawn_main" in cmd or "distributed" in cmd:
        return "worker"
    return "other"


def run_build(config: Path) -> tuple[float, dict[str, int], int]:
    """(wall s, peak kB by role (max over processes of that role), exit code) of one `trajforge build`."""
    env = {**os.environ, "COLUMNS": "160"}
    env.pop("PREFECT_API_URL", None)  # the build starts its own API server, as a user's does
    log = open(config.with_suffix(".log"), "w")
    t0 = time.time()
    proc = subprocess.Popen([str(Path(sys.executable).parent / "trajforge"), "build", str(config)], env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    root = psutil.Process(proc.pid)
    peaks: dict[int, tuple[str, int]] = {}
    while proc.poll() is None:
        try:
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            break
        for p in procs:
            try:
                name = peaks[p.pid][0] if p.pid in peaks else role(p, root.pid)
                peaks[p.pid] = (name, max(peaks.get(p.pid, (name, 0))[1], hwm_kb(p)))
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        time.sleep(0.2)
    wall = time.time() - t0
    log.close()
    by_role: dict[str, int] = {}
    for name, kb in peaks.values():
        by_role[name] = max(by_role.get(name, 0), kb)
    return wall, by_role, proc.returncode


def write_config(d: Path, samples: int, seeds: int, payload_kb: int) -> Path:
    recorded = d / "recorded.jsonl"
    with recorded.open("w") as f:
        for name in FAMILY_NAMES:
            for seed in range(seeds):
                env = FAMILIES[name].generate(1, seed)
                commands = ([f"head -c {payload_kb * 1024} /dev/urandom > payload.bin"] if payload_kb else [])
                f.write(json.dumps({"env_id": env.env_id, "commands": commands + list(env.solution)}) + "\n")
    cfg = {
        "dataset": "memscale", "runs": str(d / "runs"),
        "synthesize": {"families": [{"name": n, "levels": [1], "seeds": list(range(seeds))} for n in FAMILY_NAMES]},
        "teacher": {"backend": "replay", "replay": {"source": str(recorded)}},
        "rollout": {"samples_per_env": samples, "episodes_per_shard": 8, "concurrency": 4, "max_turns": 12},
        "verify": {"rollouts_per_shard": 8, "replay_on_sibling": False, "concurrency": 4},
        "dask": {"n_workers": 2, "threads_per_worker": 1},
    }
    path = d / "build.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def stage_mb(d: Path, stage: str) -> float:
    return sum(os.path.getsize(p) for p in glob.glob(f"{d}/runs/memscale/2*/{stage}/*/part-*.parquet")) / 1e6


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--payload-kb", type=int, default=4096, help="random bytes each rollout writes to its work dir")
    ap.add_argument("--envs-seeds", type=int, default=2, help="seeds per family (2 families, level 1)")
    ap.add_argument("--keep", action="store_true", help="keep the runs folders (removed otherwise: ~400 MB)")
    ap.add_argument("--scale", type=int, default=10, help="the larger build has this many times the rollouts")
    args = parse_quick(ap, payload_kb=256, envs_seeds=1, scale=3)
    results = {}
    for scale in (1, args.scale):
        d = Path(tempfile.mkdtemp(prefix=f"tf-memscale-{scale}x-"))
        config = write_config(d, SAMPLES_1X * scale, args.envs_seeds, args.payload_kb)
        wall, peaks, rc = run_build(config)
        if rc != 0:
            print(config.with_suffix(".log").read_text()[-3000:])
            print(f"the {scale}x build failed (exit {rc}); log: {config.with_suffix('.log')}")
            return 1  # broken: the build itself failed
        rollouts = 2 * args.envs_seeds * SAMPLES_1X * scale
        results[scale] = dict(wall=wall, peaks=peaks, rollouts=rollouts, data=stage_mb(d, "rollout"))
        if not args.keep:
            shutil.rmtree(d, ignore_errors=True)
    one, ten = results[1], results[args.scale]
    x = f"{args.scale}x"
    mb = lambda kb: f"{kb / 1024:.0f}"  # noqa: E731
    ratio = lambda a, b: f"{b / a:.2f}" if a else "-"  # noqa: E731
    driver = ten["peaks"].get("driver", 0) / max(one["peaks"].get("driver", 0), 1)
    rows = [
        ["rollouts", one["rollouts"], ten["rollouts"], ratio(one["rollouts"], ten["rollouts"]), ""],
        ["rollout Parquet MB", f"{one['data']:.0f}", f"{ten['data']:.0f}", ratio(one["data"], ten["data"]), ""],
        ["driver peak RSS MB", mb(one["peaks"].get("driver", 0)), mb(ten["peaks"].get("driver", 0)),
         f"{driver:.2f}", "≤ 1.5x growth" + ("" if args.quick or args.scale == 10 else " (at 10x)")],
        ["largest Dask worker peak RSS MB", mb(one["peaks"].get("worker", 0)), mb(ten["peaks"].get("worker", 0)),
         ratio(one["peaks"].get("worker", 0), ten["peaks"].get("worker", 0)), "(shards: for the record)"],
        ["wall s", f"{one['wall']:.0f}", f"{ten['wall']:.0f}", ratio(one["wall"], ten["wall"]), ""],
    ]
    print_table(f"memory_scale: replay build, {2 * args.envs_seeds} environments, {args.payload_kb} KiB final state "
                f"per rollout, samples_per_env {SAMPLES_1X} vs {SAMPLES_1X * args.scale} (trajforge build, LocalCluster "
                "of 2 workers)", ["figure", "1x", x, f"{x} ÷ 1x", "target"], rows)
    code = target(f"driver peak RSS at {x} ÷ at 1x", driver, "<=", 1.5, args.quick,
                  peer=f"the same build at 1x: {mb(one['peaks'].get('driver', 0))} MB")
    host_report("end")
    return code


if __name__ == "__main__":
    sys.exit(main())
