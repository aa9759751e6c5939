"""Benchmark `trial_profile`: where one trial's time goes, engine call by engine call (issue 52, "trials at the
floor": profile a `fresh` trial, every engine call, its wall and CPU).

For each task (a procedural `log_report` environment, and imported Harbor task folders of
`tests/fixtures/integrity/harbor`), this runs the reference solution as the agent's commands through the
rollout stage's episode driver (replay teacher) and then the verify stage's code, one trial at a time (P = 1,
so each call's wall time is its own), in venue `fresh` and in `in_place`; and, once per task, the validator
(`validate_env`), whose cost every build and most Docker tests pay. Every HTTP request the docker SDK sends
to the engine is recorded (`requests.Session.send` of the SDK's client, wrapped: method, the path with ids
and names folded, wall seconds). Printed: per phase the wall time, the machine's busy CPU seconds, the
engine calls per trial by kind with their summed wall time, and the share of the wall the engine calls take.

No target (for the record: it says which calls to cut; `oracle_trials` holds the targets).

Usage: python benchmarks/trial_profile.py [--trials 4] [--tasks NAME ...] [--quick]
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import add_quick, build_envs, host_report, machine_busy_s, no_target, print_table  # noqa: E402

from trajforge.schemas.config import SandboxConfig, SynthesizeConfig, parse_config  # noqa: E402
from trajforge.tasks.agent.driver import run_episodes  # noqa: E402
from trajforge.tasks.engine import StageContext  # noqa: E402
from trajforge.tasks.envs.formats import import_task  # noqa: E402
from trajforge.tasks.envs.validator import validate_env  # noqa: E402
from trajforge.tasks.sandbox import docker_client  # noqa: E402
from trajforge.tasks.verify import verify_rollouts  # noqa: E402

HARBOR = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "integrity" / "harbor"
DEFAULT_TASKS = ("expected-file", "run-script")
FOLD = [(re.compile(r"/v\d+\.\d+"), ""), (re.compile(r"/(containers|exec|images)/[^/?]+"), r"/\1/ID"),
        (re.compile(r"\?.*"), "")]


class EngineCalls:
    """Every request the docker SDK sends, as (method path, seconds), while `recording`."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float]] = []
        self.lock = threading.Lock()
        self._orig = None

    def __enter__(self) -> "EngineCalls":
        import requests

        self._orig = orig = requests.Session.send

        def send(session, request, **kw):
            t0 = time.monotonic()
            try:
                return orig(session, request, **kw)
            finally:
                path = request.path_url
                for rx, sub in FOLD:
                    path = rx.sub(sub, path)
                with self.lock:
                    self.calls.append((f"{request.method} {path}", time.monotonic() - t0))

        requests.Session.send = send
        return self

    def __exit__(self, *exc) -> None:
        import requests

        requests.Session.send = self._orig

    def take(self) -> list[tuple[str, float]]:
        with self.lock:
            out, self.calls = self.calls, []
        return out


def phase(name: str, calls: EngineCalls, fn, per: int, rows: list, kinds: dict) -> object:
    calls.take()
    c0, t0 = machine_busy_s(), time.monotonic()
    out = fn()
    wall, cpu = time.monotonic() - t0, machine_busy_s() - c0
    got = calls.take()
    engine = sum(s for _, s in got)
    rows.append([name, f"{wall / per:.2f}", f"{cpu / per:.2f}", f"{len(got) / per:.1f}", f"{engine / per:.2f}",
                 f"{100 * engine / wall:.0f}%" if wall else "-"])
    agg: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for k, s in got:
        agg[k][0] += 1
        agg[k][1] += s
    kinds[name] = {k: (n / per, s / per) for k, (n, s) in agg.items()}
    return out


def trials(runs: str, envs, n: int, venue: str):
    cfg = parse_config({"dataset": "profile", "runs": runs, "synthesize": {"families": [{"name": "log_report"}]},
                        "teacher": {"backend": "replay"}, "rollout": {"concurrency": 1, "max_turns": 8},
                        "verify": {"concurrency": 1, "replay_on_sibling": False, "venue": venue}})
    ctx = StageContext.create(cfg, "profile")
    by_id = {e.env_id: e for e in envs}
    episodes = [(envs[i % len(envs)].env_id, i // len(envs)) for i in range(n)]
    return ctx, by_id, episodes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=4, help="trials per task and venue (one at a time)")
    ap.add_argument("--tasks", nargs="*", default=list(DEFAULT_TASKS), help="Harbor fixture folders to import")
    add_quick(ap, "--trials 1, one imported task")
    args = ap.parse_args()
    if args.quick:
        args.trials, args.tasks = 1, args.tasks[:1]
    host_report("start", args.quick)
    client = docker_client()
    work = tempfile.mkdtemp(prefix="tf-trial-profile-")
    runs = f"{work}/runs"
    _, procedural = build_envs(runs, n_per_family=1, families=["log_report"])
    imported = []
    for name in args.tasks:
        env = import_task(HARBOR / name)
        validate_env(client, env, SandboxConfig(), "trajforge/base:latest", SynthesizeConfig(
            families=[{"name": "log_report"}]).image_aliases, 120, 120)  # warm: image built, layers listed
        imported.append(env)
    rows: list[list[str]] = []
    kinds: dict[str, dict] = {}
    with EngineCalls() as calls:
        for name, env in zip(args.tasks, imported):
            phase(f"validate {name}", calls, lambda env=env: validate_env(
                client, env.model_copy(deep=True), SandboxConfig(), "trajforge/base:latest",
                SynthesizeConfig(families=[{"name": "log_report"}]).image_aliases, 120, 120), 1, rows, kinds)
        for label, envs in (("procedural", procedural), ("imported", imported)):
            for venue in ("fresh", "in_place"):
                ctx, by_id, episodes = trials(runs, envs, args.trials * len(envs), venue)
                res = phase(f"{label} {venue} episode", calls, lambda c=ctx, b=by_id, e=episodes: run_episodes(c, b, e),
                            len(episodes), rows, kinds)
                ver = phase(f"{label} {venue} verify", calls, lambda c=ctx, b=by_id, r=res: verify_rollouts(c, b, r.rows),
                            len(episodes), rows, kinds)
                bad = [f"{v.env_id}: {v.status} {v.hack_flags} {v.verifier_output[-120:]!r}" for v in ver.rows
                       if not v.passed]
                if bad:
                    print(f"{label} {venue}: {len(bad)} trials did not pass: " + "; ".join(bad[:3]), flush=True)
    print_table("trial_profile: per trial (validate: per task), P = 1",
                ["phase", "wall s", "CPU s", "engine calls", "engine s", "engine share"], rows)
    for name, agg in kinds.items():
        top = sorted(agg.items(), key=lambda kv: -kv[1][1])[:12]
        print_table(f"engine calls of '{name}' (per trial)", ["call", "n", "s"],
                    [[k, f"{n:.1f}", f"{s:.3f}"] for k, (n, s) in top])
    host_report("end", args.quick)
    return no_target("trial_profile (a profile for the record)")


if __name__ == "__main__":
    sys.exit(main())
