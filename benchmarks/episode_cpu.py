"""Benchmark `episode_cpu`: the machine's CPU seconds per sandbox operation of one episode, the budget
behind the rollout stage's tokens/s on a host the teacher shares (issue 14: the rollout stage reaches
≥ 0.85 of a plain client's tokens/s only if the sandboxes leave the teacher its cores).

Runs `--rounds` episodes of one procedural environment without a teacher (its reference solution as
the agent's commands), as the harness does them: start, the commands, settle (kill, change walk,
protected checksums), capture of the work dir, in-place hidden tests, removal. Each operation's cost is
the whole machine's busy CPU time (/proc/stat: dockerd, containerd, shims, runc and the container's own
processes included) while it runs alone. The hidden tests run twice per episode, side by side: with the
tests carried in the exec's command line (the default) and uploaded by the engine first (the path for
tests larger than `INLINE_LIMIT`). Run it on a quiet machine: the load average is printed.

No target: the figures price the budget of `teacher_utilization` and `oracle_trials` (for the record).

Usage: python benchmarks/episode_cpu.py [--rounds 10] [--family log_report] [--level 1] [--quick]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import add_quick, host_report, no_target, print_table  # noqa: E402
from _common import machine_busy_s as busy_s  # noqa: E402

from trajforge.schemas.config import SandboxConfig  # noqa: E402
from trajforge.tasks.envs.families import FAMILIES  # noqa: E402
from trajforge.tasks.envs.images import ensure_image  # noqa: E402
from trajforge.tasks.judge import verifier  # noqa: E402
from trajforge.tasks.judge.verifier import VERIFIER_CAPS, run_hidden_tests  # noqa: E402
from trajforge.tasks.sandbox import Sandbox, docker_client  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--family", default="log_report")
    ap.add_argument("--level", type=int, default=1)
    add_quick(ap, "--rounds 2")
    a = ap.parse_args()
    if a.quick:
        a.rounds = 2
    host_report("start", a.quick)
    client = docker_client()
    env = FAMILIES[a.family].generate(a.level, 0)
    env.image, _ = ensure_image(client, "trajforge/base:latest", env)
    cfg = SandboxConfig()
    cost: dict[str, list[tuple[float, float]]] = {}

    def timed(op: str, fn, *args, **kw):
        c0, t0 = busy_s(), time.monotonic()
        out = fn(*args, **kw)
        cost.setdefault(op, []).append((busy_s() - c0, time.monotonic() - t0))
        return out

    inline_limit = verifier.INLINE_LIMIT
    for i in range(a.rounds + 1):  # the first round warms the image's caches (listing, agent roots): not counted
        sb = Sandbox(client, env.image, cfg, workdir=env.workdir, cap_add=VERIFIER_CAPS, agent=env.agent_user)
        timed("start", sb.start)
        for cmd in env.solution:
            timed("agent command", sb.exec, cmd, 60)
        timed("settle", sb.settle, env.protected)
        timed("capture work dir", sb.get_archive, env.workdir, 64 << 20)
        for mode, limit in (("hidden tests, in the exec", inline_limit), ("hidden tests, uploaded", -1)):
            verifier.INLINE_LIMIT = limit
            run = timed(mode, run_hidden_tests, sb, env, 60)
            assert run.passed, (mode, run.error, run.output[-500:])
        verifier.INLINE_LIMIT = inline_limit
        timed("remove", sb.close)
        if i == 0:
            cost.clear()
    rows = []
    per_episode = 0.0
    for op, xs in cost.items():
        per_ep = len(xs) / a.rounds
        cpu = sum(c for c, _ in xs) / len(xs)
        wall = sum(w for _, w in xs) / len(xs)
        if op != "hidden tests, uploaded":
            per_episode += cpu * per_ep
        rows.append([op, f"{per_ep:g}", f"{cpu:.3f}", f"{wall:.3f}"])
    rows.append(["episode (tests in the exec)", "1", f"{per_episode:.3f}", ""])
    inl = sum(c for c, _ in cost["hidden tests, in the exec"]) / a.rounds
    upl = sum(c for c, _ in cost["hidden tests, uploaded"]) / a.rounds
    print_table(f"episode_cpu: {a.family} L{a.level}, {a.rounds} rounds, {os.cpu_count()} CPUs, "
                f"load {os.getloadavg()[0]:.2f} at the end",
                ["operation", "per episode", "machine CPU-s each", "wall s each"], rows)
    print(f"hidden tests in the exec / uploaded first: {inl:.3f} / {upl:.3f} CPU-s = {inl / upl:.2f}")
    no_target("CPU seconds per sandbox operation, for the record")
    host_report("end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
