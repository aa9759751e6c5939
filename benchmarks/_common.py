"""Shared set-up for the benchmarks: environments with built images, committed as a `synthesize`
manifest so stage code can read them, a plain table printer (pasted into issue notes), the machine's
busy CPU seconds, a single-turn chat client for the embedded teacher, the host line (CPU model, `lscpu` flags,
`uptime`) a benchmark prints with its table, and the contract every benchmark keeps with `benchmarks/_run.py`
(`make bench`, `make bench-quick`): `--quick` (tiny sizes, same code path), `host_report` at start and end, one `target(...)` line per target,
exit code 0 (ran; targets met, not judged or none), `MISSED` (ran; a target missed) or anything else (broken)."""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import subprocess
import time

from trajforge.schemas.config import SandboxConfig, parse_config
from trajforge.schemas.environment import DEFAULT_WORKDIR, EnvSpec
from trajforge.tasks.agent.harness import FENCED_HINT, SYSTEM_PROMPT
from trajforge.tasks.engine import Manifest, StageContext
from trajforge.tasks.envs.families import FAMILIES
from trajforge.tasks.envs.images import ensure_image
from trajforge.tasks.envs.validator import profile_reference
from trajforge.tasks.sandbox import docker_client


def build_envs(runs: str, n_per_family: int = 4, families: list[str] | None = None,
               levels: tuple[int, ...] = (1, 2, 3), oracle: bool = True) -> tuple[Manifest, list[EnvSpec]]:
    """Environments with images built and, with `oracle`, the reference solution's change set recorded
    as the validator records it (untimed set-up: what a synthesized environment carries)."""
    client = docker_client()
    envs = []
    for name in families or sorted(FAMILIES):
        fam = FAMILIES[name]
        for i in range(n_per_family):
            env = fam.generate(levels[i % len(levels)], i)
            env.image, _ = ensure_image(client, "trajforge/base:latest", env)
            if oracle:
                profile_reference(client, env, SandboxConfig(), 120, 120)
            envs.append(env)
    ctx = StageContext.create(parse_config({"dataset": "bench-envs", "runs": runs,
                                            "synthesize": {"families": [{"name": "log_report"}]}}), "bench")
    path = f"{ctx.store.root}/synthesize/part-00000.parquet"
    ctx.store.write_records(path, EnvSpec, envs)
    manifest = Manifest(stage="synthesize", fingerprint="bench", build_id="bench", dir=ctx.store.root, parts=[path],
                        rows=len(envs), rejects=0, reject_reasons={}, stats={}, components={}, gate={},
                        created_at="")
    return manifest, envs


def print_table(title: str, header: list[str], rows: list[list]) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    line = lambda cells: "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    print(f"\n{title}\n")
    print(line(header))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print(line(r))
    print()


def machine_busy_s() -> float:
    """The whole machine's busy CPU seconds so far (every CPU, /proc/stat: dockerd, containerd, shims, runc,
    containers and this process alike; idle and iowait left out, guest time already counted in user)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


ISA_FLAGS = ("avx", "avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "amx_int8")


def _lscpu() -> dict[str, str]:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in out.splitlines()) if v}


def host_lines() -> list[str]:
    """`cpu: <model>, N CPUs; lscpu flags: avx yes, avx2 yes, avx512f no, ...` and `uptime: ...` (the load
    average: whether something else was running)."""
    info = _lscpu()
    flags = set(info.get("Flags", "").split())
    source = "lscpu"
    if not flags:  # no lscpu: the kernel's list is the same one
        from trajforge.tasks.teachers.cpu_profile import cpu_flags
        flags, source = set(cpu_flags()[0]), "/proc/cpuinfo"
    have = ", ".join(f"{f} {'yes' if f in flags else 'no'}" for f in ISA_FLAGS)
    try:
        up = subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        up = "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return [f"cpu: {info.get('Model name', '?')}, {os.cpu_count()} CPUs; {source} flags: {have}", f"uptime: {up}"]


MISSED = 3  # exit code: the benchmark ran and printed its figures, and a target was missed (not broken)
QUICK_NOTE = "quick mode: figures not comparable to targets"


def add_quick(ap: argparse.ArgumentParser, sizes: str) -> None:
    """`--quick`: tiny sizes (`sizes`, what it sets) through the same code path end to end (`make bench-quick`,
    CI): a benchmark that breaks fails there; its figures are printed but not judged."""
    ap.add_argument("--quick", action="store_true",
                    help=f"tiny sizes, same code path ({sizes}); {QUICK_NOTE}")


def parse_quick(ap: argparse.ArgumentParser, **tiny) -> argparse.Namespace:
    """`--quick` (whose sizes are `tiny`: option name -> value), the arguments parsed with `tiny` applied in
    quick mode, and the host lines at start."""
    add_quick(ap, " ".join(f"--{k.replace('_', '-')} {v}" for k, v in tiny.items()))
    args = ap.parse_args()
    if args.quick:
        for k, v in tiny.items():
            setattr(args, k, v)
    host_report("start", args.quick)
    return args


def host_report(when: str, quick: bool = False) -> None:
    """The host lines (`lscpu` flags, load) at the `start` or `end` of a benchmark, and the quick-mode note."""
    for line in host_lines():
        print(f"host at {when}: {line}")
    if quick:
        print(QUICK_NOTE)
    print(flush=True)


def target(figure: str, value: float, op: str, bound: float, quick: bool = False, peer: str = "") -> int:
    """Print `target: FIGURE = VALUE (target OP BOUND[, peer PEER]): met|MISSED` (quick mode: `not judged`) and
    return the exit code it calls for (0 or `MISSED`). A NaN value is a missed target. `op`: `>=` or `<=`."""
    ok = not math.isnan(value) and (value >= bound if op == ">=" else value <= bound)
    verdict = f"not judged ({QUICK_NOTE})" if quick else "met" if ok else "MISSED"
    peer = f"; peer: {peer}" if peer else ""
    print(f"target: {figure} = {value:.2f} (target {op} {bound:g}{peer}): {verdict}", flush=True)
    return 0 if quick or ok else MISSED


def no_target(what: str) -> int:
    """Print `target: none (WHAT)` for a benchmark whose figures are for the record; return 0."""
    print(f"target: none ({what})", flush=True)
    return 0


async def single_turn_client(url: str, prompts: list[str], concurrency: int, seconds: float, max_tokens: int,
                             temperature: float, forced: bool = False) -> tuple[int, float]:
    """(completion tokens, wall s) of `concurrency` clients sending single-turn requests (the rollout's system
    prompt + one of `prompts`) to the embedded teacher's server for `seconds`; `forced`: every completion exactly
    `max_tokens` long (`min_tokens` + `ignore_eos`)."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=url, api_key="EMPTY", max_retries=0, timeout=600)
    extra = {"extra_body": {"min_tokens": max_tokens, "ignore_eos": True}} if forced else {}
    tokens = 0
    deadline = time.monotonic() + seconds

    async def worker(i: int) -> None:
        nonlocal tokens
        n = i
        while time.monotonic() < deadline:
            r = await client.chat.completions.create(
                model="smollm2", max_tokens=max_tokens, temperature=temperature, **extra,
                messages=[{"role": "system", "content": SYSTEM_PROMPT.format(workdir=DEFAULT_WORKDIR) + FENCED_HINT},
                          {"role": "user", "content": prompts[n % len(prompts)]}])
            tokens += r.usage.completion_tokens
            n += concurrency

    t0 = time.monotonic()
    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    wall = time.monotonic() - t0
    await client.close()
    return tokens, wall
