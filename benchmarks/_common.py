"""Shared set-up for the benchmarks: environments with built images, committed as a `synthesize`
manifest so stage code can read them, and a plain table printer (pasted into issue notes)."""

from __future__ import annotations

from trajforge.schemas.config import SandboxConfig, parse_config
from trajforge.schemas.environment import EnvSpec
from trajforge.tasks.engine import Manifest, StageContext
from trajforge.tasks.envs.families import FAMILIES
from trajforge.tasks.envs.images import ensure_image
from trajforge.tasks.envs.validator import oracle_changes
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
                env.expected_changes = oracle_changes(client, env, SandboxConfig(), 120) or []
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
