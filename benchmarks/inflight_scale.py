"""Benchmark `inflight_scale` (issue 14, "in-flight scale for GPU teachers").

On a GPU the teacher is fast and the limit moves to how many episodes one host keeps in flight. No GPU
server runs here, so the teacher is tests/fake_openai.py in its own process, answering at an AGGREGATE
token rate (default 3000 tok/s) shared equally by the requests in flight, as continuous batching does:
each answer of `--tokens` completion tokens takes tokens / (rate / n) seconds with n requests in flight
(`--stream-tok-s` caps one sequence's speed). It answers like the replay teacher, with tool calls:
`--explore` short look-around commands, the environment's reference solution, then `submit`.

Per concurrency C (default 32, 64, 128, 256; `--episodes-per-c` x C episodes each, at most
`--max-episodes` but at least C) the rollout stage's
own code path runs (RolloutStage.plan + execute_shard: real hardened Docker sandboxes, the agent harness,
in-place hidden tests, Parquet written), with `teacher.max_inflight_per_endpoint` = C (the default, 32,
caps the requests in flight; `--default-cap-at C` adds one row at the default to show it).

Printed per C: episodes in flight (time-weighted mean and p50 of the driver's running episodes, over the
whole run and over the steady window: from when C first ran until the last episode was admitted),
teacher busy share (time with >= 1 request in flight at the fake server), mean requests in flight there,
per-request latency p50/p95 as the server timed it, episodes/s, host CPU (% of all cores from
/proc/stat, and CPU seconds by process group: this driver, the fake teacher, dockerd, containerd,
containerd, this benchmark's containerd-shims and runc calls, the processes inside its containers (their
cgroups), the rest: other users of the machine), what the cores can sustain (CPU seconds per episode),
memory (host used at peak, growth per container in flight; per container: cgroup rss / usage and its
shim's rss) and where an episode's time goes. Host probes: benchmarks/_host_probe.py.

Usage: python benchmarks/inflight_scale.py [--concurrency 32 64 128 256] [--episodes-per-c 2]
       [--max-episodes 256] [--rate 3000] [--tokens 150] [--explore 2] [--default-cap-at 64] [--quick]

No target in DESIGN.md: the figures (in-flight episodes, teacher busy share) are for the record.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

from _common import add_quick, build_envs, host_report, no_target, print_table  # noqa: E402
from _host_probe import Monitor, Timers, cpu_model, get_stats, weighted  # noqa: E402

from trajforge.schemas.config import parse_config  # noqa: E402
from trajforge.tasks.engine import StageContext, execute_shard  # noqa: E402
from trajforge.tasks.rollout import RolloutStage  # noqa: E402

# the terminal families (bash tools); tool-use families (bookings, ...) offer their own tools instead
FAMILIES = ["config_repair", "csv_convert", "file_search", "git_recover", "log_report", "python_bugfix",
            "shell_script", "sql_query"]
EXPLORE = ["ls -la", "find . -maxdepth 2 -type f | head -20", "wc -c * 2>/dev/null | tail -5", "id && pwd"]


# --- the fake teacher, in its own process (its CPU and GIL apart from the driver's) -----------------

def _serve(conn, plan_file: str, rate: float, stream: float | None, tokens: int, explore: int) -> None:
    from fake_openai import FakeOpenAI, tool_call

    plan = json.loads(Path(plan_file).read_text())  # instruction -> reference-solution commands

    def script(req: dict, n: int) -> dict:
        msgs = req.get("messages", [])
        instruction = next((m.get("content") for m in msgs if m.get("role") == "user"), "")
        turn = sum(1 for m in msgs if m.get("role") == "assistant")
        commands = EXPLORE[:explore] + plan.get(instruction, [])
        return tool_call(commands[turn] if turn < len(commands) else None, turn)

    srv = FakeOpenAI("ok", script, rate_tok_s=rate, stream_tok_s=stream, completion_tokens=tokens)
    conn.send(srv.url)
    srv.server.serve_forever()


# --- measurements ---------------------------------------------------------------------------------

class RecordingContext(StageContext):
    """A stage context that also keeps every (time, counters) the driver reports (it reports at every
    change of `running`, so the in-flight series is exact)."""

    series: list

    def report(self, force: bool = False, **counters) -> None:
        self.series.append((time.monotonic(), counters.get("running", 0), counters.get("done", 0),
                            counters.get("total", 0)))
        super().report(force, **counters)


# --- one point --------------------------------------------------------------------------------------

def run_point(args, runs: str, envs_manifest, envs, plan_file: str, C: int, cap: int, timers: Timers,
              episodes: int) -> dict:
    ctx_mp = mp.get_context("spawn")
    parent, child = ctx_mp.Pipe()
    server = ctx_mp.Process(target=_serve, args=(child, plan_file, args.rate, args.stream_tok_s, args.tokens,
                                                 args.explore), daemon=True)
    server.start()
    try:
        url = parent.recv()
        samples = -(-episodes // len(envs))
        teacher = {"backend": "openai", "model": "fake", "endpoints": [url], "tool_calling": True,
                   "max_tokens": max(args.tokens, 16), "temperature": 0.0, "max_inflight_per_endpoint": cap}
        cfg = parse_config({"dataset": f"inflight-c{C}-cap{cap}", "runs": runs,
                            "synthesize": {"families": [{"name": "log_report"}]}, "teacher": teacher,
                            "rollout": {"samples_per_env": samples, "max_turns": args.explore + 4, "concurrency": C,
                                        "episodes_per_shard": samples * len(envs), "command_timeout_s": 20,
                                        "verify_in_place": not args.no_verify_in_place}})
        ctx = RecordingContext.create(cfg, "bench", {"teacher_endpoints": [url]})
        ctx.series = []
        stage = RolloutStage()
        shard = stage.plan(ctx, {"synthesize": envs_manifest})[0]
        shard.payload["episodes"] = shard.payload["episodes"][:episodes]
        out = f"{ctx.store.root}/rollout/c{C}-cap{cap}"
        timers.reset()
        with Monitor(server.pid, url, timers) as mon:
            t0 = time.monotonic()
            info = execute_shard(stage, ctx, out, shard, {"synthesize": envs_manifest})
            t1 = time.monotonic()
        final = get_stats(url)
    finally:
        server.terminate()
        server.join(10)
    rows = ctx.store.read_records([f"{out}/{info['part']}"], stage.output)
    stats = info["stats"]
    series = [(t, running) for t, running, _, _ in ctx.series]
    full_at = next((t for t, running, _, _ in ctx.series if running >= C), t0)
    admitted_at = next((t for t, running, done, total in ctx.series if done + running >= total), t1)
    mean, p50 = weighted(series, t0, t1)
    s_mean, s_p50 = weighted(series, full_at, admitted_at) if admitted_at > full_at else (float("nan"),) * 2
    s_busy, s_inflight = mon.teacher_between(full_at, admitted_at)
    lat = sorted(final["latencies"])
    return {"C": C, "cap": cap, "episodes": len(rows), "wall": t1 - t0, "mean": mean, "p50": p50,
            "s_mean": s_mean, "s_p50": s_p50, "s_window": admitted_at - full_at,
            "busy": final["busy_s"] / (t1 - t0), "t_inflight": final["inflight_s"] / (t1 - t0),
            "s_busy": s_busy, "s_inflight": s_inflight, "max_inflight": final["max_inflight"],
            "tok_s": final["tokens"] / (t1 - t0), "lat50": lat[len(lat) // 2] if lat else float("nan"),
            "lat95": lat[int(len(lat) * 0.95)] if lat else float("nan"),
            "status": dict(stats["status"]), "stats": stats, "spent": {k: (sum(v), len(v)) for k, v in timers.spent.items()},
            "peak_open": timers.peak_open, "mon": mon, "turns": stats["turns"], "commands": stats["commands"]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--concurrency", type=int, nargs="+", default=[32, 64, 128, 256])
    ap.add_argument("--episodes-per-c", type=int, default=2)
    ap.add_argument("--max-episodes", type=int, default=256, help="at most this many episodes per point")
    ap.add_argument("--rate", type=float, default=3000, help="aggregate completion tokens/s of the fake teacher")
    ap.add_argument("--stream-tok-s", type=float, default=None, help="cap of one sequence's tokens/s")
    ap.add_argument("--tokens", type=int, default=150, help="completion tokens per answer")
    ap.add_argument("--explore", type=int, default=2, choices=range(len(EXPLORE) + 1),
                    help="look-around commands before the reference solution")
    ap.add_argument("--default-cap-at", type=int, default=64,
                    help="one more row, C episodes at this C, with the default max_inflight_per_endpoint (0: none)")
    ap.add_argument("--no-verify-in-place", action="store_true")
    add_quick(ap, "--concurrency 4 --episodes-per-c 1 --max-episodes 4 --default-cap-at 0, one environment per family")
    args = ap.parse_args()
    if args.quick:
        args.concurrency, args.episodes_per_c, args.max_episodes, args.default_cap_at = [4], 1, 4, 0
    host_report("start", args.quick)

    from trajforge.tasks.teachers.openai import OpenAIClientConfig

    default_cap = OpenAIClientConfig.model_fields["max_inflight_per_endpoint"].default
    runs = tempfile.mkdtemp(prefix="tf-inflight-")
    envs_manifest, envs = build_envs(runs, n_per_family=1 if args.quick else 4, families=FAMILIES, oracle=False)  # (rollout never reads it)
    plan_file = f"{runs}/plan.json"
    Path(plan_file).write_text(json.dumps({e.instruction: list(e.solution) for e in envs}))
    timers = Timers()
    points = [(c, c, min(args.episodes_per_c * c, max(c, args.max_episodes))) for c in args.concurrency]
    if args.default_cap_at:
        points.append((args.default_cap_at, default_cap, args.default_cap_at))
    results = []
    for C, cap, episodes in points:
        print(f"... C={C} (in-flight cap {cap}): {episodes} episodes; load {os.getloadavg()[0]:.1f}", flush=True)
        results.append(run_point(args, runs, envs_manifest, envs, plan_file, C, cap, timers, episodes))
        report(args, results)  # after every point: a partial table survives an interrupted run
    no_target("in-flight episodes and teacher busy share at a GPU-speed fake teacher, for the record")
    host_report("end")
    return 0


def report(args, results: list[dict]) -> None:
    ncpu = os.cpu_count() or 1
    label = lambda r: f"{r['C']}" + ("" if r["cap"] == r["C"] else f" (cap {r['cap']})")  # noqa: E731
    print_table(f"inflight_scale: fake teacher at {args.rate:g} tok/s aggregate, {args.tokens} tokens/answer"
                + (f", <= {args.stream_tok_s:g} tok/s per sequence" if args.stream_tok_s else "")
                + f", {args.explore} look-around commands + reference solution + submit; {ncpu} CPUs",
                ["C", "episodes", "wall s", "episodes/s", "in flight mean / p50", "steady: in flight, teacher busy",
                 "teacher busy", "teacher reqs in flight (max)", "teacher tok/s (of rate)",
                 "request latency p50 / p95 s", "statuses"],
                [[label(r), r["episodes"], f"{r['wall']:.0f}", f"{r['episodes'] / r['wall']:.2f}",
                  f"{r['mean']:.0f} / {r['p50']:.0f}",
                  f"{r['s_mean']:.0f}, {r['s_busy']:.2f} ({r['s_window']:.0f} s)",
                  f"{r['busy']:.2f}", f"{r['t_inflight']:.1f} ({r['max_inflight']})",
                  f"{r['tok_s']:.0f} ({r['tok_s'] / args.rate:.2f})", f"{r['lat50']:.2f} / {r['lat95']:.2f}",
                  ", ".join(f"{k} {v}" for k, v in sorted(r["status"].items()))] for r in results])
    groups = ["this driver", "fake teacher", "dockerd", "containerd", "containerd-shim", "runc (est.)",
              "inside containers"]
    rows = []
    for r in results:
        m = r["mon"]
        known = sum(m.cpu.get(g, 0.0) for g in groups)
        busy_s = m.busy_frac * m.wall * ncpu
        rows.append([label(r), f"{100 * m.busy_frac:.0f}%",
                     *[f"{m.cpu.get(g, 0.0) / m.wall:.2f}" for g in groups], f"{(busy_s - known) / m.wall:.2f}",
                     f"{m.load0[0]:.1f} -> {m.load1[0]:.1f}", f"{m.mem_peak:.0f}",
                     f"{(m.mem_peak - m.mem0) / max(1, r['peak_open']):.1f} ({r['peak_open']})",
                     "{1:.1f} / {2:.1f} / {3:.1f} ({0})".format(*m.per_container), m.threads_peak])
    print_table("host: CPU (% of all cores; cores busy per process group), load, memory",
                ["C", "host CPU", *[f"{g} cores" for g in groups], "rest cores (incl. other users)",
                 "load 1 min (start -> end)", "host used peak MiB", "host growth MiB per container (peak containers)",
                 "per container MiB: cgroup rss / cgroup usage / shim rss (containers)", "driver threads peak"], rows)
    mine = ["this driver", "dockerd", "containerd", "containerd-shim", "runc (est.)", "inside containers"]
    rows = []
    for r in results:
        m, n = r["mon"], r["episodes"]
        cpu_ep = sum(m.cpu.get(g, 0.0) for g in mine) / n
        tok_ep = r["tok_s"] * r["wall"] / n
        sustain = ncpu / cpu_ep
        rows.append([label(r), f"{cpu_ep:.2f}", f"{m.cpu.get('this driver', 0.0) / n:.2f}",
                     f"{sum(m.cpu.get(g, 0.0) for g in mine[1:5]) / n:.2f}", f"{m.cpu.get('inside containers', 0.0) / n:.2f}",
                     f"{tok_ep:.0f}", f"{sustain:.2f}", f"{sustain / ncpu:.2f}", f"{min(1.0, sustain * tok_ep / args.rate):.2f}",
                     f"{args.rate / tok_ep:.1f}"])
    print_table(f"what {ncpu} cores can sustain (CPU seconds per episode of this driver + Docker + containers; "
                "the fake teacher excluded: on a GPU host it runs elsewhere)",
                ["C", "CPU s / episode", "driver", "dockerd+containerd+shims+runc", "in containers", "tokens / episode",
                 f"episodes/s on {ncpu} idle cores", "episodes/s per core", "teacher busy that allows",
                 "episodes/s the teacher could take"], rows)
    rows = []
    for r in results:
        s, n = r["stats"], r["episodes"]
        sp = r["spent"]
        per = lambda k, sp=sp, n=n: sp.get(k, (0.0, 0))[0] / n  # noqa: E731
        parts = ["start wait", "settle (kill, changes, checksums)", "capture (archives)", "hidden tests in place",
                 "container remove"]
        other = s["episode_seconds"] / n - s["teacher_seconds"] / n - s["command_seconds"] / n - sum(per(k) for k in parts)
        ex_s, ex_n = sp.get("docker exec (every one)", (0.0, 0))
        rows.append([label(r), f"{s['episode_seconds'] / n:.1f}", f"{s['teacher_seconds'] / n:.1f}",
                     f"{s['command_seconds'] / n:.2f} ({s['commands'] / n:.1f})", f"{per('container start'):.2f}",
                     *[f"{per(k):.2f}" for k in parts], f"{other:.2f}",
                     f"{ex_s / max(1, ex_n) * 1000:.0f} ({ex_n / n:.1f})", f"{s.get('teacher_wait_seconds', 0) / n:.2f}"])
    print_table("where an episode's time goes (seconds per episode, mean; container start overlaps turn 1)",
                ["C", "episode", "teacher (turns)", "commands (n)", "container start", "waiting for the start",
                 "settle", "capture", "hidden tests", "container remove", "other (thread pool, event loop)",
                 "docker exec ms (n)", "teacher slot wait"], rows)
    from trajforge.tasks.teachers.openai import OpenAIClientConfig

    cap = OpenAIClientConfig.model_fields["max_inflight_per_endpoint"].default
    print(f"knobs: rollout.concurrency = C (no upper bound); driver thread pool 2C+8 and docker HTTP pool 2C+4 "
          f"follow it; teacher.max_inflight_per_endpoint (default {cap}) caps teacher requests in flight per "
          f"endpoint whatever C is: set here to C, except rows marked (cap {cap})")
    print(f"cpu: {cpu_model()}; {ncpu} CPUs; statistics of {len(results)} points; "
          f"median episode/s {statistics.median(r['episodes'] / r['wall'] for r in results):.2f}")


if __name__ == "__main__":
    sys.exit(main())
