"""Benchmark `mcp_session`: tool calls per second into a `tools` environment's MCP server in a sandbox,
through one persistent MCP session (what the harness holds per episode since issue 32) against a server
process per call (what the relay did before).

One real tool environment (a procedural tool family's instance, its image built on the tools layer) and
one sandbox; side by side in one run, interleaved in blocks so that load drifts hit every side alike:
(a) a process per call: `Sandbox.exec` through the Docker API of the call command the reference solution
    uses (`server.py call NAME ARGS`: start the server, one call, exit) as the agent user in the work dir;
(b) the harness's session (tasks/envs/tools/client.py `ToolSession`): the official MCP SDK's
    `ClientSession` over `docker exec -i` through the Docker API, initialized once, then every call on it;
(c) the floor: `docker exec CONTAINER true` (the CLI, a process per exec), and, for the record, the
    sandbox's own exec of `true` (the per-call path without the server).
Every call is the environment's first reference call (the same tool and arguments each time: a
domain error on a repeat is still a full round trip; outcomes are counted).

Prints calls/s and per-call ms (median, p90) per side, (b) / (a), and the per-call cost of a process per
call over the floor ((a) - (c), medians). No target: issue 32 asks for the figures (for the record).

Usage: python benchmarks/mcp_session.py [--calls 200] [--block 20] [--family bookings] [--level 1] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import host_report, no_target, parse_quick, print_table  # noqa: E402

from trajforge.schemas.config import SandboxConfig  # noqa: E402
from trajforge.tasks.envs.families import FAMILIES  # noqa: E402
from trajforge.tasks.envs.images import ensure_image  # noqa: E402
from trajforge.tasks.envs.tools.client import ToolSession  # noqa: E402
from trajforge.tasks.envs.tools.spec import call_command, parse_call_command  # noqa: E402
from trajforge.tasks.sandbox import Sandbox, docker_client  # noqa: E402


def stats(times: list[float], wall: float) -> list[str]:
    q = statistics.quantiles(times, n=10)
    return [str(len(times)), f"{len(times) / wall:.1f}", f"{statistics.median(times) * 1e3:.1f}", f"{q[8] * 1e3:.1f}"]


async def run(sb: Sandbox, name: str, args: dict, calls: int, block: int) -> dict[str, tuple[list[float], float]]:
    out: dict[str, tuple[list[float], float]] = {k: ([], 0.0) for k in ("a", "b", "c", "c2")}
    outcomes: dict[str, dict[str, int]] = {"a": {}, "b": {}}
    command = call_command(name, args)

    def add(side: str, dt: float, outcome: str | None = None) -> None:
        times, wall = out[side]
        times.append(dt)
        out[side] = (times, wall + dt)
        if outcome is not None:
            outcomes[side][outcome] = outcomes[side].get(outcome, 0) + 1

    session = ToolSession(sb)
    t0 = time.monotonic()
    await session.start()
    setup = time.monotonic() - t0
    try:
        done = 0
        while done < calls:
            n = min(block, calls - done)
            for _ in range(n):  # (a) a server process per call
                t = time.monotonic()
                r = sb.exec(command, 60)
                add("a", time.monotonic() - t, "ok" if r.exit_code == 0 else f"exit {r.exit_code}")
            for _ in range(n):  # (b) the harness's persistent SDK session
                t = time.monotonic()
                o = await session.call(name, args, 60)
                add("b", time.monotonic() - t, o.outcome)
            for _ in range(n):  # (c) the floor: `docker exec true`
                t = time.monotonic()
                subprocess.run(["docker", "exec", sb.name, "true"], check=True)
                add("c", time.monotonic() - t)
            for _ in range(n):  # (c2) the sandbox's own exec of `true` (the per-call path, no server)
                t = time.monotonic()
                sb.exec("true", 60)
                add("c2", time.monotonic() - t)
            done += n
    finally:
        await session.close(kill=True)
    print(f"session set-up (docker exec -i + initialize): {setup * 1e3:.0f} ms, once; outcomes: "
          f"process per call {outcomes['a']}, session {outcomes['b']}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=200, help="calls per side")
    ap.add_argument("--block", type=int, default=20, help="calls per side before the next side's turn")
    ap.add_argument("--family", default="bookings", help="a tool family")
    ap.add_argument("--level", type=int, default=1)
    a = parse_quick(ap, calls=20, block=10)
    client = docker_client()
    env = FAMILIES[a.family].generate(a.level, 0)
    env.image, _ = ensure_image(client, "trajforge/base:latest", env)
    name, args = _first_call(env)
    print(f"environment {env.env_id} ({a.family} level {a.level}), image {env.image}; every call: {name} {args}")
    with Sandbox(client, env.image, SandboxConfig(), workdir=env.workdir,
                 labels={"trajforge.bench": "mcp_session"}) as sb:
        sb.exec(call_command(name, args), 60)  # warm: the image's layers, python's bytecode
        out = asyncio.run(run(sb, name, args, a.calls, a.block))
    header = ["side", "calls", "calls/s", "median ms", "p90 ms"]
    labels = {"a": "(a) a server process per call (Sandbox.exec)",
              "b": "(b) the harness's MCP SDK session (docker exec -i)",
              "c": "(c) floor: docker exec true (CLI)",
              "c2": "(c2) Sandbox.exec('true') (the per-call exec path)"}
    print_table("tool calls into the sandbox's MCP server", header,
                [[labels[k], *stats(times, wall)] for k, (times, wall) in out.items()])
    med = {k: statistics.median(times) for k, (times, _) in out.items()}
    rate = {k: len(times) / wall for k, (times, wall) in out.items()}
    print(f"(b) / (a) calls/s: {rate['b'] / rate['a']:.1f}x; a process per call over the floor, (a) - (c) "
          f"medians: {(med['a'] - med['c']) * 1e3:.1f} ms; over the sandbox's own exec, (a) - (c2): "
          f"{(med['a'] - med['c2']) * 1e3:.1f} ms")
    host_report("end", a.quick)
    return no_target("calls/s through a persistent session vs a process per call: for the record (issue 32)")


def _first_call(env) -> tuple[str, dict]:
    """The environment's first reference call (tool name, arguments)."""
    for command in env.solution:
        call = parse_call_command(command)
        if call:
            return call
    raise SystemExit(f"{env.env_id}: no tool call in its reference solution")


if __name__ == "__main__":
    sys.exit(main())
