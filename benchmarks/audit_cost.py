"""Benchmark `audit_cost` (issue 42): what the test audit adds to validation, per environment.

For each environment (procedural: level 1 of several families; imported: the sound Harbor / Terminal-Bench
look-alikes of tests/fixtures/weak and the interop fixtures), its image is built first (not timed), then the
validator runs every check with the default audit settings (`synthesize.audit: reject`, `audit_mutants`).
The audit's wall seconds and the machine's busy CPU seconds during it (`/proc/stat`: dockerd and containers
included) are measured around the audit call; the rest of validation is the validation's total minus them.

Printed per environment: test runs, CPU s and wall s of the audit beside the rest of validation, and their
ratio; then per group (procedural, imported) and overall. Target (DESIGN.md): the audit adds at most 1x
the validation time it extends (sum of audit wall s / sum of the rest's wall s <= 1.0).

    python benchmarks/audit_cost.py [--families 6] [--quick]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import host_report, machine_busy_s, parse_quick, print_table, target  # noqa: E402

from trajforge.schemas.config import SandboxConfig, SynthesizeConfig  # noqa: E402
from trajforge.tasks.envs import validator  # noqa: E402
from trajforge.tasks.envs.audit import AuditSettings  # noqa: E402
from trajforge.tasks.envs.families import FAMILIES, get_family  # noqa: E402
from trajforge.tasks.envs.formats import import_task  # noqa: E402
from trajforge.tasks.envs.images import ensure_image  # noqa: E402
from trajforge.tasks.sandbox import docker_client  # noqa: E402

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures"
IMPORTED = [FIXTURES / "harbor" / "count-words", FIXTURES / "tbench" / "sort-names",
            *sorted(p for p in (FIXTURES / "weak").glob("*/*-sound"))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", type=int, default=6, help="procedural families (level 1, seed 0)")
    ap.add_argument("--imported", type=int, default=len(IMPORTED), help="imported task folders")
    args = parse_quick(ap, families=1, imported=1)
    s, sandbox = SynthesizeConfig(families=[{"name": "log_report"}]), SandboxConfig()
    client = docker_client(pool_size=8, sandbox=sandbox)
    terminal = sorted(f for f in FAMILIES if FAMILIES[f].kind == "terminal")
    tools = sorted(f for f in FAMILIES if FAMILIES[f].kind != "terminal")
    names = (terminal[:max(1, args.families - 1)] + tools[:1])[:args.families]
    envs = [("procedural", get_family(f).generate(1, 0)) for f in names]
    envs += [("imported", import_task(p)) for p in IMPORTED[:args.imported]]

    measured: dict[str, tuple[float, float]] = {}
    real_audit = validator.run_audit

    def timed_audit(sb, env, *a, **kw):
        c0, t0 = machine_busy_s(), time.monotonic()
        try:
            return real_audit(sb, env, *a, **kw)
        finally:
            measured[env.env_id] = (machine_busy_s() - c0, time.monotonic() - t0)

    validator.run_audit = timed_audit
    rows, sums = [], {}
    for group, env in envs:
        ensure_image(client, sandbox.base_image, env, s.image_aliases, limits=sandbox)  # built before timing
        c0 = machine_busy_s()
        v = validator.validate_env(client, env, sandbox, sandbox.base_image, s.image_aliases, s.solution_timeout_s,
                                   s.test_timeout_s, audit=AuditSettings(s.audit, s.audit_mutants))
        cpu_total = machine_busy_s() - c0
        a_cpu, a_wall = measured.get(env.env_id, (0.0, 0.0))
        rest_wall, rest_cpu = max(v.seconds - a_wall, 1e-6), max(cpu_total - a_cpu, 0.0)
        rows.append([group, env.env_id[:40], "kept" if v.ok else v.reject.reason, env.audit.status,
                     f"{env.audit.killed}/{env.audit.tried}", env.audit.test_runs, f"{a_cpu:.2f}", f"{a_wall:.2f}",
                     f"{rest_cpu:.2f}", f"{rest_wall:.2f}", f"{a_wall / rest_wall:.2f}"])
        g = sums.setdefault(group, [0.0, 0.0, 0.0, 0.0, 0])
        g[0] += a_wall
        g[1] += rest_wall
        g[2] += a_cpu
        g[3] += rest_cpu
        g[4] += env.audit.test_runs
    validator.run_audit = real_audit
    print_table("test audit cost per environment (audit beside the rest of validation)",
                ["group", "environment", "verdict", "audit", "killed/tried", "test runs", "audit CPU s",
                 "audit wall s", "rest CPU s", "rest wall s", "audit/rest wall"], rows)
    print_table("per group", ["group", "test runs", "audit CPU s", "audit wall s", "rest CPU s", "rest wall s",
                              "audit/rest wall", "audit/rest CPU"],
                [[g, n, f"{ac:.2f}", f"{aw:.2f}", f"{rc:.2f}", f"{rw:.2f}", f"{aw / rw:.2f}",
                  f"{ac / rc:.2f}" if rc else "-"] for g, (aw, rw, ac, rc, n) in sums.items()])
    audit_wall = sum(x[0] for x in sums.values())
    rest_wall = sum(x[1] for x in sums.values())
    host_report("end", args.quick)
    return target("audit wall s / rest of validation wall s", audit_wall / rest_wall, "<=", 1.0, args.quick,
                  peer=f"the rest of validation, {rest_wall:.1f} s over {len(envs)} environments")


if __name__ == "__main__":
    sys.exit(main())
