"""Benchmark `trace_overhead` (no target; for the record): what the host's tracer (tasks/judge/trace.py) adds to one
hidden-test run, side by side on the same container state.

The task is `tests/fixtures/integrity/tbench/usr-local-tool` (pytest runs the agent's `/usr/local/bin/revlines`, a
`subprocess`-exposure task: the kind the judge traces). Its reference solution is applied once; then, alternating in
each round, `run_hidden_tests(..., trace=False)` and `trace=True` on that container. Figures: the median wall time of
each side and their ratio (traced / plain); the traced runs must record reads (`TestRun.reads` not None).

Usage: python benchmarks/trace_overhead.py [--rounds 6] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import host_report, no_target, parse_quick, print_table  # noqa: E402

TASK = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "integrity" / "tbench" / "usr-local-tool"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=6, help="runs of each side (alternating); the median counts")
    args = parse_quick(ap, rounds=2)

    import docker

    from trajforge.schemas.config import SandboxConfig, SynthesizeConfig
    from trajforge.tasks.envs.formats import import_task
    from trajforge.tasks.envs.images import ensure_image
    from trajforge.tasks.judge.trace import available
    from trajforge.tasks.judge.verifier import VERIFIER_CAPS, run_hidden_tests
    from trajforge.tasks.sandbox import Sandbox

    client = docker.from_env()
    env = import_task(TASK)
    cfg = SandboxConfig()
    env.image, _ = ensure_image(client, cfg.base_image, env, SynthesizeConfig(families=[{"name": "log_report"}])
                                .image_aliases, limits=cfg)
    times: dict[bool, list[float]] = {False: [], True: []}
    with Sandbox(client, env.image, cfg, workdir=env.workdir, cap_add=VERIFIER_CAPS, agent=env.agent_user) as sb:
        if not available(sb):
            print("no tracer here (strace on this host and a local engine are needed): nothing to compare")
            return no_target("tracer unavailable")
        for cmd in env.solution:
            assert sb.exec(cmd, 120).exit_code == 0, "the reference solution failed"
        sb.settle([])
        for i in range(args.rounds):
            for traced in ((False, True) if i % 2 == 0 else (True, False)):
                t0 = time.monotonic()
                run = run_hidden_tests(sb, env, 120, trace=traced)
                times[traced].append(time.monotonic() - t0)
                assert run.passed, run.output[-500:]
                assert (run.reads is not None) == traced, "a traced run recorded nothing / a plain one did"
    plain, traced = statistics.median(times[False]), statistics.median(times[True])
    print_table(f"one hidden-test run of {TASK.name}, median of {args.rounds} (s)", ["side", "wall s"],
                [["plain", f"{plain:.2f}"], ["traced", f"{traced:.2f}"], ["traced / plain", f"{traced / plain:.2f}"]])
    host_report("end", args.quick)
    return no_target("for the record: the tracer's cost on a subprocess-exposure test run")


if __name__ == "__main__":
    raise SystemExit(main())
