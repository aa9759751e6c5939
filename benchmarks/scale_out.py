"""Scale-out overhead (issue 30 item 6): rollout episodes/s with sandboxes on one Docker engine vs two.

Two "hosts" on this machine (deploy/hosts/two-hosts.sh: network namespaces, a dockerd and a Dask worker
each; a registry, the scheduler, the Prefect server, the driver and a stand-in teacher in a hub namespace).
The same build (environments x rollouts; the stand-in answers at once, with the reference solution of
every other environment) runs side by side, alternating, `--rounds` times:
  (1) one engine: only host a's worker attached;
  (2) two engines: both hosts' workers;
  (3) two engines with a fleet creation limit (`sandbox.fleet.creations_per_s`), for its waits.
Both hosts share this machine's CPUs, so (2) / (1) is what spreading costs, not a speed-up (target >= 0.9).
Episodes/s is the rollout stage's: its episodes over the time the stage was running (the build record
polled). Also per side: images built, pushed and pulled, sandboxes created per engine, fleet waits.
Each build is a new dataset (nothing reused but the images on the engines, which are content-addressed).

Usage: python benchmarks/scale_out.py [--quick] [--rounds R] [--seeds N] [--samples K]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "tests"))

from _common import host_report, no_target, parse_quick, print_table, target  # noqa: E402
from chaos_kit import newest_build, stage_status  # noqa: E402
from hosts_kit import Hosts, Sandboxes, config, logs, netns_unavailable, stats  # noqa: E402

from trajforge.tasks.engine.store import RunStore  # noqa: E402


def rollout_rate(hosts: Hosts, cfg: Path, dataset: str, runs: Path) -> tuple[float, float, dict]:
    """(episodes/s of the rollout stage, its running seconds, the build's stage stats)."""
    engines = {}
    for h in ("a", "b"):
        try:
            engines[h] = hosts.engine(h)
            engines[h].ping()
        except Exception:  # host b is down on the one-engine side
            engines.pop(h, None)
    store = RunStore(str(runs), dataset)
    first = last = None
    with Sandboxes(engines) as boxes:
        proc = hosts.build(cfg, background=True)
        while proc.poll() is None:
            build_id = newest_build(store)
            if build_id and stage_status(store, build_id).get("rollout") == "running":
                now = time.monotonic()
                first, last = first or now, now
            time.sleep(0.05)
    out = proc.stdout.read()
    if proc.returncode != 0 or first is None:
        sys.exit(f"build {dataset} failed (code {proc.returncode}):\n{out[-3000:]}{logs(hosts.state)}")
    committed = stats(runs, dataset)
    running = max(last - first, 0.05)
    committed["per_engine"] = {"a": 0, "b": 0, **boxes.counts()}
    return committed["rollout"]["episodes"] / running, running, committed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seeds", type=int, default=4, help="environments per family (3 families)")
    ap.add_argument("--samples", type=int, default=4, help="rollouts per environment")
    ap.add_argument("--rate", type=float, default=4.0, help="sandbox.fleet.creations_per_s of side (3)")
    args = parse_quick(ap, rounds=1, seeds=1, samples=2)
    why = netns_unavailable()
    if why:
        print(f"this machine cannot create network namespaces ({why}): nothing measured")
        return no_target("no network namespaces here")
    work = Path(tempfile.mkdtemp(prefix="trajforge-scale-"))
    hosts = Hosts(work / "hosts", prefix="tfb")
    hosts.up()
    seeds = tuple(range(args.seeds))
    sides = {"one engine": {}, "two engines": {}, f"two, fleet {args.rate:g}/s": {"sandbox.fleet": {
        "creations_per_s": args.rate, "burst": 1}}}
    rates: dict[str, list[float]] = {s: [] for s in sides}
    rows = []
    try:
        for r in range(args.rounds):
            for i, (side, over) in enumerate(sides.items()):
                if side == "one engine":
                    hosts.sh("kill", "b")  # its worker leaves the cluster (and its engine with it)
                dataset = f"r{r}s{i}"
                cfg = config(work, dataset, seeds=seeds, samples=args.samples, **over)
                rate, running, c = rollout_rate(hosts, cfg, dataset, work / "runs")
                if side == "one engine":
                    back = hosts.sh("revive", "b")
                    if back.returncode != 0:
                        sys.exit(f"host b did not come back:\n{back.stderr}{logs(hosts.state)}")
                rates[side].append(rate)
                ro, ve = c["rollout"], c["verify"]
                rows.append([r + 1, side, ro["episodes"], f"{running:.1f}", f"{rate:.2f}",
                             f"a {c['per_engine']['a']} / b {c['per_engine']['b']}",
                             c["synthesize"].get("images_built", 0), c["synthesize"].get("images_pushed", 0),
                             ro.get("images_pulled", 0) + ve.get("images_pulled", 0),
                             ro.get("images_built_here", 0) + ve.get("images_built_here", 0),
                             f"{ro.get('fleet_wait_create_s', 0):.1f}", ve.get("passed", 0)])
                print(f"  round {r + 1} {side}: {ro['episodes']} episodes, rollout {running:.1f} s, {rate:.2f}/s",
                      flush=True)
    finally:
        hosts.sh("down")
    print_table("rollout episodes/s, one engine vs two on the same CPUs (each build a new dataset)",
                ["round", "side", "episodes", "rollout s", "episodes/s", "sandboxes per engine", "built",
                 "pushed", "pulled", "built on a 2nd engine", "fleet wait s", "passed"], rows)
    med = {s: statistics.median(v) for s, v in rates.items()}
    ratio = med["two engines"] / med["one engine"]
    host_report("end")
    return target("two engines / one engine, rollout episodes/s (same CPUs)", ratio, ">=", 0.9, args.quick,
                  peer=f"one engine {med['one engine']:.2f}/s, two {med['two engines']:.2f}/s")


if __name__ == "__main__":
    sys.exit(main())
