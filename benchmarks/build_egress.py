"""Benchmark `build_egress`: the wall time of a networked image build through the build policy
(`synthesize.build.egress: allowlist`: trajforge's build network, every request through its egress proxy)
beside the same build on the host's network (`egress: host`), interleaved, same Dockerfile.

The Dockerfile is an imported task's typical one: `apt-get update && apt-get install` of one small Debian
package, then (not in `--quick`) `pip install` of one small PyPI package. Each build starts with a fresh
nonce step, so nothing comes from Docker's layer cache; the images it built are removed at the end. The
package traffic goes to Debian's mirror and PyPI (through this machine's package proxy).

Usage: python benchmarks/build_egress.py [--rounds 3] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import host_report, no_target, parse_quick, print_table  # noqa: E402

from trajforge.schemas.config import DEFAULT_EGRESS_ALLOWLIST  # noqa: E402
from trajforge.schemas.environment import EnvSpec, FileSpec  # noqa: E402
from trajforge.tasks.envs.images import BuildOptions, ensure_image, host_ca_bundle  # noqa: E402
from trajforge.tasks.sandbox import docker_client  # noqa: E402

APT = ("RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "
       "bc {pip_pkg} >/dev/null && rm -rf /var/lib/apt/lists/*")
PIP = "RUN pip install -q --no-cache-dir --break-system-packages six==1.16.0 && python3 -c 'import six'"


def env_for(nonce: str, with_pip: bool) -> EnvSpec:
    steps = [f"RUN echo {nonce} > /etc/bench-nonce", APT.format(pip_pkg="python3-pip" if with_pip else "")]
    if with_pip:
        steps.append(PIP)
    return EnvSpec(env_id=f"bench-egress-{nonce}", family="bench", level=1, seed=0, instruction="bench", source="harbor",
                   dockerfile="FROM debian:bookworm\n" + "\n".join(steps) + "\nWORKDIR /app\n", workdir="/app",
                   agent_user="root", tests=[FileSpec(path="test.sh", content="true")], solution=["true"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="builds per policy (interleaved)")
    ap.add_argument("--pip", action=argparse.BooleanOptionalAction, default=True, help="also pip install a package")
    args = parse_quick(ap, rounds=1, pip=False)
    client = docker_client()
    ca = host_ca_bundle()
    options = {"allowlist": BuildOptions(egress="allowlist", allowlist=DEFAULT_EGRESS_ALLOWLIST, ca_bundle=ca),
               "host": BuildOptions(egress="host", ca_bundle=ca)}
    walls: dict[str, list[float]] = {k: [] for k in options}
    built: list[str] = []
    try:
        for r in range(args.rounds):
            for policy in (("allowlist", "host") if r % 2 == 0 else ("host", "allowlist")):
                env = env_for(uuid.uuid4().hex[:12], args.pip)
                t0 = time.monotonic()
                tag, _ = ensure_image(client, "trajforge/base:latest", env, {"debian:*": "{base}"},
                                      options=options[policy])
                walls[policy].append(time.monotonic() - t0)
                built.append(tag)
                print(f"round {r + 1} {policy}: {walls[policy][-1]:.1f}s ({env.build_egress})", flush=True)
    finally:
        for tag in built:
            try:
                client.images.remove(tag, force=True)
            except Exception:  # noqa: BLE001 (clean-up is best effort)
                pass
    med = {k: statistics.median(v) for k, v in walls.items()}
    print_table("networked build: through the build policy vs on the host's network",
                ["policy", "builds", "median s", "min s", "max s"],
                [[k, len(v), f"{med[k]:.1f}", f"{min(v):.1f}", f"{max(v):.1f}"] for k, v in walls.items()])
    print(f"allowlist ÷ host wall time: {med['allowlist'] / med['host']:.2f}")
    code = no_target("for the record: the build policy's cost on a networked build")
    host_report("end")
    return code


if __name__ == "__main__":
    sys.exit(main())
