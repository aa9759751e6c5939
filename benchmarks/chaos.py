"""Benchmark `chaos` (target: N/N kills survived, 0 rows lost, 0 rows duplicated, 0 orphans).

Runs `trajforge build` (the CLI, as a user does: Prefect flow, Dask LocalCluster, real containers,
the replay teacher) on the small build of tests/chaos_kit.py. First one uninterrupted build, timed and
watched: its wall time T, the span of each stage in it (build.json polled), its rollout ids and export
rows are the reference. Kill points are drawn where the build spends its working time, not uniformly
over its wall time (start-up and bookkeeping between stages were most of it, so only ~1 kill in 20 fell
in rollout): a stage is drawn with a weight equal to its duration in the reference, and a fraction f of
it; the victim is killed f x (that duration, scaled by how fast the victim reached the stage compared
with the reference) after the stage started running, and in rollout and verify only once a sandbox of
the build is running (episodes in flight). Then N times, each in a fresh runs
folder: start the same build, SIGKILL the driver alone (not its process group) at that point, and run
the same command again (it resumes the killed build). A build that ends before its kill point is one
more uninterrupted build (T: the median) and the point is drawn again, up to 3 times. Printed: each
kill (aimed stage, landed stage, live sandboxes at the kill), the kill points per stage, and the audit:
- survived: the resume exits 0, resumes the killed build (a new one only when the kill came before
  any build was recorded or after it was committed), the build is committed and its export rows
  equal the reference's (content columns; timings left out);
- rows lost / duplicated: rollout ids of the reference missing from / repeated in the committed
  rollout output;
- orphans: processes the killed driver or the resume started that are still alive once the resume
  has ended, plus containers of the build (or owned by one of those processes) still on the engine;
- resume overhead: kill time + resume wall - T (what the crash cost), in seconds and as a ratio to T.

Usage: python benchmarks/chaos.py [--n 20] [--seed 0] [--keep] [--quick]   (quick: --n 1)
"""

from __future__ import annotations

import argparse
import collections
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "tests"))

from _common import add_quick, host_report, print_table, target  # noqa: E402
from chaos_kit import (  # noqa: E402
    Driver,
    build_containers,
    chaos_config,
    describe,
    export_content,
    newest_build,
    orphan_containers,
    record,
    rollout_ids,
    stage_status,
    write_config,
)

from trajforge.tasks.engine.store import RunStore  # noqa: E402
from trajforge.tasks.sandbox import docker_client  # noqa: E402

IN_FLIGHT = ("rollout", "verify")  # stages whose kill waits for a running sandbox (episodes in flight)


def reference(folder: Path) -> tuple[float, dict[str, tuple[float, float]], dict, dict]:
    """(wall s, {stage: (s from the start to it, s it was running)}, rollout ids, export content) of an
    uninterrupted build."""
    cfg = chaos_config(folder / "runs")
    driver = Driver(write_config(folder, cfg), folder / "build.log")
    store = RunStore(cfg["runs"], cfg["dataset"])
    seen: dict[str, list[float]] = {}  # stage -> [first seen running, last seen running]
    while driver.running():
        build_id = newest_build(store)
        now = time.monotonic() - driver.t0
        for stage, status in (stage_status(store, build_id) if build_id else {}).items():
            if status == "running":
                seen.setdefault(stage, [now, now])[1] = now
        driver.sample()
        time.sleep(0.05)
    code = driver.proc.returncode
    wall = time.monotonic() - driver.t0
    if code != 0:
        sys.exit(f"the uninterrupted build failed (code {code}):\n{driver.tail()}")
    build_id = newest_build(store)
    spans = {stage: (a, max(b - a, 0.05)) for stage, (a, b) in seen.items()}
    return wall, spans, rollout_ids(store, build_id), export_content(store, build_id)


def where(store: RunStore) -> str:
    """The stage the newest build was in (`start-up` before any build is recorded)."""
    build_id = newest_build(store)
    if build_id is None:
        return "start-up"
    running = [k for k, v in stage_status(store, build_id).items() if v == "running"]
    return running[-1] if running else ("done" if record(store, build_id).get("status") == "committed" else "between")


def live_sandboxes(client, store: RunStore) -> int:
    build_id = newest_build(store)
    if build_id is None:
        return 0
    return sum(c.attrs.get("State") == "running" for c in build_containers(client, build_id))


def one_kill(folder: Path, stage: str, frac: float, span: tuple[float, float], ref_ids: dict, ref_export: dict,
             client) -> dict:
    """Start a build, SIGKILL its driver `frac` of the way into `stage` (in rollout and verify: once a sandbox
    of the build runs as well), resume it with the same command and audit the resume. `span`: (start,
    duration) of the stage in the reference; the duration is scaled by how fast this build reached the
    stage compared with the reference (the host's load changes from build to build: unscaled, a point
    late in a stage often fell after its end)."""
    cfg = chaos_config(folder / "runs")
    config = write_config(folder, cfg)
    store = RunStore(cfg["runs"], cfg["dataset"])
    victim = Driver(config, folder / "killed.log")
    began = None  # when `stage` was first seen running
    live = 0
    while victim.running():
        build_id = newest_build(store)
        status = stage_status(store, build_id).get(stage) if build_id else None
        now = time.monotonic()
        if began is None and status == "running":
            began = now
            after_s = frac * span[1] * min(4.0, max(0.25, (began - victim.t0) / max(span[0], 0.1)))
        if began is not None and (status != "running" or now - began >= after_s):
            live = live_sandboxes(client, store)
            if status != "running" or stage not in IN_FLIGHT or live:
                break  # (the stage ended first: killed where the build now is, and said so)
        victim.sample()
        time.sleep(0.02)
    into = time.monotonic() - began if began is not None else None
    if victim.running():
        killed_at, landed = victim.kill(), where(store)
    else:  # it ended before the kill point: faster this time than the reference, or failed by itself
        killed_at = time.monotonic() - victim.t0
        landed = "ended first" if victim.proc.returncode == 0 else f"failed ({victim.proc.returncode})"
    killed_build = newest_build(store)
    # a kill after the build was committed (while the driver printed its summary or stopped its cluster):
    # the same command then starts a new build that reuses every stage
    committed = killed_build is not None and record(store, killed_build).get("status") == "committed"
    resume = Driver(config, folder / "resume.log")
    code = resume.wait()
    resume_wall = time.monotonic() - resume.t0
    build_id = newest_build(store)
    row = dict(at=killed_at, aimed=stage, into=into, stage=landed, live=live, resume_s=resume_wall, code=code,
               lost=None, dup=None, same=False, resumed=killed_build is None or build_id == killed_build or committed)
    if code == 0 and build_id and record(store, build_id).get("status") == "committed":
        ids = rollout_ids(store, build_id)
        row["lost"] = len(set(ref_ids) - set(ids))
        row["dup"] = sum(n - 1 for n in ids.values())
        row["same"] = export_content(store, build_id) == ref_export
    procs = victim.alive_descendants() + resume.alive_descendants(grace_s=10)
    pids = set(victim.seen) | set(resume.seen) | {victim.pid, resume.pid}
    containers = sorted({n for b in store.builds() for n in orphan_containers(client, b, pids)})
    row["orphans"] = len(procs) + len(containers)
    row["orphan_names"] = describe(procs) + containers
    row["survived"] = (code == 0 and not landed.startswith("failed") and row["same"] and row["resumed"]
                       and row["lost"] == 0 and row["dup"] == 0)
    if not row["survived"] or row["orphans"]:
        print(f"  kill at {killed_at:.1f}s ({landed}): code {code}, orphans {row['orphan_names']}\n"
              f"{resume.tail(2000)}", file=sys.stderr)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=20, help="kill points")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", action="store_true", help="keep the runs folders (printed)")
    add_quick(ap, "--n 1")
    args = ap.parse_args()
    if args.quick:
        args.n = 1
    host_report("start", args.quick)
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="trajforge-chaos-"))
    client = docker_client()
    try:
        wall, spans, ref_ids, ref_export = reference(work / "reference")
        print(f"uninterrupted build: {wall:.1f} s, {len(ref_ids)} rollouts, "
              f"{sum(len(v) for v in ref_export.values())} export rows; stages (s): "
              + ", ".join(f"{k} {v[1]:.1f}" for k, v in spans.items()), file=sys.stderr)
        stages = list(spans)
        rows, walls = [], [wall]
        for i in range(args.n):
            for attempt in range(3):  # a build that ends before its kill point was an uninterrupted one:
                stage = rng.choices(stages, weights=[spans[k][1] for k in stages])[0]  # its time is measured
                r = one_kill(work / f"kill-{i:02d}-{attempt}", stage, rng.random(), spans[stage], ref_ids,
                             ref_export, client)  # too, and the point is drawn again
                if r["stage"] != "ended first":
                    break
                walls.append(r["at"])
            rows.append(r)
            print(f"  [{i + 1}/{args.n}] kill at {r['at']:5.1f}s aimed {r['aimed']:<10} landed {r['stage']:<10} "
                  f"sandboxes {r['live']} resume {r['resume_s']:5.1f}s survived={r['survived']} lost={r['lost']} "
                  f"dup={r['dup']} orphans={r['orphans']}", file=sys.stderr, flush=True)
    finally:
        client.close()
        if args.keep:
            print(f"runs kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)

    wall = statistics.median(walls)
    work_s = sum(d for _, d in spans.values())
    print_table(f"Kill points (uninterrupted build: median {wall:.1f} s of {len(walls)}; its stages ran {work_s:.1f} s, "
                "kill points drawn over that time)",
                ["#", "kill at (s)", "aimed", "s into it", "landed in", "live sandboxes", "resume (s)", "survived",
                 "lost", "dup", "orphans"],
                [[i + 1, f"{r['at']:.1f}", r["aimed"], "-" if r["into"] is None else f"{r['into']:.1f}", r["stage"],
                  r["live"], f"{r['resume_s']:.1f}", "yes" if r["survived"] else "NO", r["lost"], r["dup"],
                  r["orphans"]] for i, r in enumerate(rows)])
    landed = collections.Counter(r["stage"] for r in rows)
    print_table("Kill points per stage (weight: the stage's share of the reference build's stage time)",
                ["stage", "reference (s)", "weight", "aimed", "landed", "landed with sandboxes live"],
                [[k, f"{spans[k][1]:.1f}" if k in spans else "-", f"{spans[k][1] / work_s:.2f}" if k in spans else "-",
                  sum(r["aimed"] == k for r in rows), landed.get(k, 0),
                  sum(r["stage"] == k and r["live"] > 0 for r in rows)]
                 for k in [*stages, *sorted(set(landed) - set(stages))]])
    killed = [r for r in rows if r["stage"] != "ended first" and not r["stage"].startswith("failed")]
    overhead = [r["at"] + r["resume_s"] - wall for r in killed]
    ratio = [(r["at"] + r["resume_s"]) / wall for r in killed]
    print_table("Chaos: kill -9 of the driver where the build works, then resume (target: N/N, 0, 0, 0)",
                ["kills survived", "in rollout or verify", "rows lost", "rows duplicated", "orphans left",
                 "mean resume overhead"],
                [[f"{sum(r['survived'] for r in rows)}/{len(rows)}", sum(landed.get(k, 0) for k in IN_FLIGHT),
                  sum(r["lost"] or 0 for r in rows), sum(r["dup"] or 0 for r in rows), sum(r["orphans"] for r in rows),
                  f"{statistics.mean(overhead):.1f} s ({statistics.mean(ratio):.2f}x)" if killed else "n/a"]])
    if len(killed) < len(rows):
        print(f"({len(rows) - len(killed)} build(s) ended before their kill point; counted, not in the overhead)")
    peer = f"the uninterrupted build, median {wall:.1f} s"
    codes = [target("kills survived (share of N)", sum(r["survived"] for r in rows) / len(rows), ">=", 1, args.quick,
                    peer=peer),
             target("rows lost + duplicated", sum((r["lost"] or 0) + (r["dup"] or 0) for r in rows), "<=", 0, args.quick),
             target("orphans left", sum(r["orphans"] for r in rows), "<=", 0, args.quick)]
    host_report("end")
    return max(codes)


if __name__ == "__main__":
    sys.exit(main())
