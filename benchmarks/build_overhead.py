"""The fixed cost of a build (issue 52): a one-environment, one-trial replay build, cold process, warm images, timed
phase by phase, beside the same trial run by a plain docker-SDK loop, in one run.

Each round runs `trajforge build` in a new process on a new run folder (images are content-addressed and built in an
untimed warm-up build first: "warm images") and stamps every line the driver prints with its time since the process
started. The phases are read from those lines:

- `start`: process start to the `build ... on a local Dask cluster` line (imports, the config, the lease, the Prefect
  API server: launched first, waited for last);
- `flow start`: to the first stage's `▶` line (the flow run, the Dask cluster's scheduler and worker);
- one row per stage, its `▶` line to its `✓` line (plan, shards on the worker, gate, commit);
- `summary`: the last `✓` to the summary table (the report, the build's Prefect artifacts);
- `teardown`: the summary to the process's exit (the Dask cluster and the API server stopped).

Beside them: the same trial (the environment's reference solution, then its hidden tests) in a plain docker-SDK loop
(benchmarks/oracle_trials.py's (d): create, start, exec the solution, put the tests, exec them, remove), `trajforge
--help` in a cold process, and `import trajforge.flows.cli` alone.

Beside the default (a local cluster of worker processes), each round runs the same build with `dask.processes:
false` (the workers as threads of the build: no worker process to start and import), phase by phase in its own
column.

Targets (on the default): the build's wall ≤ 3 × the SDK loop's trial + 10 s; `trajforge --help` ≤ 2 s.

Usage: python benchmarks/build_overhead.py [--rounds 3] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import host_report, parse_quick, print_table, target  # noqa: E402
from oracle_trials import SdkLoop, committed_envs, plan  # noqa: E402

TRAJFORGE = Path(sys.executable).parent / "trajforge"
CONFIG = {"dataset": "overhead", "synthesize": {"families": [{"name": "log_report", "levels": [1], "seeds": [0]}]},
          "teacher": {"backend": "replay"}, "rollout": {"samples_per_env": 1, "episodes_per_shard": 1},
          "dask": {"n_workers": 1, "threads_per_worker": 1}}


def stamped_build(cfg: Path) -> tuple[float, list[tuple[float, str]]]:
    """(wall s, [(s since start, line)]) of `trajforge build CFG` in a new process; SystemExit if it fails."""
    t0 = time.monotonic()
    proc = subprocess.Popen([str(TRAJFORGE), "build", str(cfg)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, cwd=cfg.parent, env={"COLUMNS": "200", **_env()})
    lines: list[tuple[float, str]] = []

    def pump() -> None:
        for line in proc.stdout:
            lines.append((time.monotonic() - t0, line.rstrip()))

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    code = proc.wait()
    wall = time.monotonic() - t0
    reader.join(10)
    if code:
        raise SystemExit(f"trajforge build {cfg} exited {code}:\n" + "\n".join(line for _, line in lines[-40:]))
    return wall, lines


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PREFECT_API_URL", None)  # the build starts its own API server, as a user's does
    return env


def phases(wall: float, lines: list[tuple[float, str]]) -> list[tuple[str, float]]:
    """The phases of one build (module docstring) from its stamped lines, in order; their sum is `wall`."""
    def first(pred, after: float = -1.0) -> float:
        return next(t for t, line in lines if t > after and pred(line))

    out: list[tuple[str, float]] = []
    began = first(lambda s: s.startswith("build ") and " of dataset " in s)
    out.append(("start (imports, config, Prefect API)", began))
    opened = [(t, s.split()[1]) for t, s in lines if s.startswith("▶ ")]
    closed = {s.split()[1]: t for t, s in lines if s.startswith("✓ ")}
    out.append(("flow start (flow run, Dask cluster)", opened[0][0] - began))
    last = opened[0][0]
    for t, stage in opened:
        out.append((f"stage {stage}", closed[stage] - t))
        last = closed[stage]
    summary = first(lambda s: " · build " in s, after=last)
    out.append(("summary (report, Prefect artifacts)", summary - last))
    out.append(("teardown (Dask, API server, exit)", wall - summary))
    return out


def cold(cmd: list[str]) -> float:
    t0 = time.monotonic()
    subprocess.run(cmd, check=True, capture_output=True, env=_env())
    return time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = parse_quick(ap, rounds=1)
    root = Path(tempfile.mkdtemp(prefix="trajforge-overhead-"))
    cfg = root / "one.yaml"
    cfg.write_text(yaml.safe_dump({**CONFIG, "runs": str(root / "warm")}))
    print("warm-up build (images, untimed) ...", flush=True)
    stamped_build(cfg)
    build = max((root / "warm" / "overhead").glob("2*"), key=lambda p: p.name)
    env = committed_envs(build)[0]
    loop = SdkLoop([plan(env)], 1)
    ok, out = loop.trial(0)  # (warm-up: the SDK's connection pool)
    if not ok:
        raise SystemExit(f"the plain SDK loop's trial did not pass: {out}")
    builds, per_phase, trials, helps, imports = [], {}, [], [], []
    threads, per_phase_threads = [], {}

    def timed(runs: Path, walls: list[float], per: dict[str, list[float]], **over) -> float:
        cfg.write_text(yaml.safe_dump({**CONFIG, "runs": str(runs), **over}))
        wall, lines = stamped_build(cfg)
        walls.append(wall)
        for name, seconds in phases(wall, lines):
            per.setdefault(name, []).append(seconds)
        return wall

    for k in range(args.rounds):
        wall = timed(root / f"r{k}", builds, per_phase)
        wall_t = timed(root / f"t{k}", threads, per_phase_threads, dask={**CONFIG["dask"], "processes": False})
        t0 = time.monotonic()
        ok, out = loop.trial(0)
        trials.append(time.monotonic() - t0)
        if not ok:
            raise SystemExit(f"the plain SDK loop's trial did not pass: {out}")
        helps.append(cold([str(TRAJFORGE), "--help"]))
        imports.append(cold([sys.executable, "-c", "import trajforge.flows.cli"]))
        print(f"round {k + 1}: build {wall:.1f} s ({wall_t:.1f} s with threads), SDK trial {trials[-1]:.2f} s, "
              f"--help {helps[-1]:.2f} s", flush=True)
    med = statistics.median

    def t(name: str) -> str:
        return f"{med(per_phase_threads[name]):.2f}" if name in per_phase_threads else ""

    rows = [[name, f"{med(v):.2f}", f"{100 * med(v) / med(builds):.0f} %", t(name)] for name, v in per_phase.items()]
    rows += [["whole build (wall)", f"{med(builds):.2f}", "100 %", f"{med(threads):.2f}"],
             ["plain docker-SDK loop, the same trial", f"{med(trials):.2f}", "", ""],
             ["`trajforge --help`, cold process", f"{med(helps):.2f}", "", ""],
             ["`import trajforge.flows.cli`, cold process", f"{med(imports):.2f}", "", ""]]
    print_table(f"one-environment, one-trial replay build, cold process, warm images (median of {args.rounds})",
                ["phase", "s (default: worker processes)", "share", "s (dask.processes: false)"], rows)
    host_report("end", args.quick)
    bound = 3 * med(trials) + 10
    code = target("build wall s", med(builds), "<=", round(bound, 2), args.quick,
                  peer=f"3 x the SDK loop's {med(trials):.2f} s trial + 10 s")
    code |= target("trajforge --help s", med(helps), "<=", 2, args.quick)
    return code


if __name__ == "__main__":
    sys.exit(main())
