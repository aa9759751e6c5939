"""`trajforge envs ...` and `trajforge images ...`: environments outside a build.

envs families | sample FAMILY --level L --seed S | validate PATH|ID | import DIR | export ID DIR
images prune [--all]

An environment ID is a procedural one (`family-l<level>-s<seed>`, optionally with its content-hash
suffix) or the env_id of an environment committed in a build under `--runs`. `validate` and `import`
run the same validator as a build (settings from `--config`, else the defaults).
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from ..schemas.config import ConfigError, SandboxConfig, SynthesizeConfig, load_config
from ..schemas.environment import EnvSpec
from .console import console, err_console, fail

envs_app = typer.Typer(no_args_is_help=True, help="Environment families and environments.")
images_app = typer.Typer(no_args_is_help=True, help="Content-addressed environment images.")


@envs_app.command("families")
def envs_families():
    """List the procedural environment families and their levels."""
    from ..tasks.envs.families import FAMILIES

    t = Table(title="environment families")
    for col in ("family", "levels", "what the agent does"):
        t.add_column(col)
    for f in FAMILIES.values():
        t.add_row(f.name, ", ".join(map(str, f.levels)), f.description)
    console.print(t)


@envs_app.command("sample")
def envs_sample(family: str, level: int = typer.Option(1, "--level"), seed: int = typer.Option(0, "--seed"),
                tests: bool = typer.Option(False, "--tests", help="include the hidden tests")):
    """Print one generated environment (instruction, files, solution) as JSON."""
    from ..tasks.envs.families import get_family

    try:
        env = get_family(family).generate(level, seed)
    except (KeyError, ValueError) as err:
        fail(str(err).strip("'\""))
    console.print_json(env.model_dump_json(exclude=None if tests else {"tests"}))


def _settings(config: Optional[Path]) -> tuple[SynthesizeConfig, SandboxConfig]:
    if config is None:
        return SynthesizeConfig(families=[{"name": "log_report"}]), SandboxConfig()
    try:
        cfg = load_config(config)
    except ConfigError as err:
        fail(str(err))
    return cfg.synthesize, cfg.sandbox


def _resolve(ref: str, runs: str) -> list[EnvSpec]:
    """Task folder(s), a procedural id, or an env_id committed in a build under `runs`."""
    from ..tasks.envs.catalogue import EnvNotFound, from_folder, resolve
    from ..tasks.envs.formats import TaskFormatError, detect

    try:
        if Path(ref).is_dir() and not detect(Path(ref)):  # a folder of tasks: report the unreadable ones
            found, rejects = from_folder(Path(ref))
            for r in rejects:
                err_console.print(f"[red]✗[/] {r.detail}")
            if found:
                return [env for _, env in found]
        return resolve(ref, runs=runs)
    except (EnvNotFound, TaskFormatError) as err:
        fail(str(err))


def _validate_all(envs: list[EnvSpec], s: SynthesizeConfig, sandbox: SandboxConfig, jobs: int):
    from ..tasks.envs.catalogue import sibling_of
    from ..tasks.envs.validator import validate_env
    from ..tasks.sandbox import docker_client

    try:
        client = docker_client(pool_size=2 * jobs + 4)
    except Exception as err:
        fail(str(err), 1)

    def one(env: EnvSpec):
        return env, validate_env(client, env, sandbox, sandbox.base_image, s.image_aliases, s.solution_timeout_s,
                                 s.test_timeout_s, sibling=sibling_of)

    with ThreadPoolExecutor(jobs) as pool:
        return list(pool.map(one, envs))


def _report(results, title: str) -> int:
    from ..tasks.envs.validator import CHECKS

    t = Table(title=title)
    for col in ("environment", "source", *CHECKS, "verdict"):
        t.add_column(col)
    mark = {"pass": "[green]pass[/]", "fail": "[red]fail[/]", "skip": "skip"}
    for env, v in results:
        t.add_row(env.env_id, env.source, *(mark.get(v.checks.get(c, ""), "") for c in CHECKS),
                  "[green]kept[/]" if v.ok else f"[red]{v.reject.reason}[/]")
    console.print(t)
    for env, v in results:
        if not v.ok:
            console.print(f"[red]✗[/] {env.env_id}: {v.reject.reason}: {v.reject.detail}")
    return sum(not v.ok for _, v in results)


@envs_app.command("validate")
def envs_validate(ref: str = typer.Argument(..., help="task folder(s), family-l<L>-s<S>, or a committed env_id"),
                  config: Optional[Path] = typer.Option(None, help="take validator settings from this build config"),
                  runs: str = typer.Option("./runs"), jobs: int = typer.Option(2, help="validations at once")):
    """Run every validator check on environments; exit 1 if any is rejected."""
    s, sandbox = _settings(config)
    envs = _resolve(ref, runs)
    rejected = _report(_validate_all(envs, s, sandbox, jobs), f"validation of {ref}")
    raise typer.Exit(1 if rejected else 0)


@envs_app.command("import")
def envs_import(folder: Path = typer.Argument(..., help="a Harbor / Terminal-Bench task folder, or a folder of them"),
                out: Optional[Path] = typer.Option(None, help="write the admitted environments here (JSONL)"),
                config: Optional[Path] = typer.Option(None), jobs: int = typer.Option(2)):
    """Import task folders through the validator (a build takes them with `synthesize.imports`)."""
    s, sandbox = _settings(config)
    envs = _resolve(str(folder), "./runs")
    results = _validate_all(envs, s, sandbox, jobs)
    rejected = _report(results, f"import of {folder}")
    if out:
        out.write_text("".join(env.model_dump_json() + "\n" for env, v in results if v.ok))
        console.print(f"wrote {len(results) - rejected} environment(s) to {out}")
    raise typer.Exit(1 if rejected else 0)


@envs_app.command("export")
def envs_export(ref: str = typer.Argument(..., help="family-l<L>-s<S> or a committed env_id"),
                dest: Path = typer.Argument(..., help="folder to write the Harbor task folder into"),
                runs: str = typer.Option("./runs")):
    """Write an environment as a Harbor task folder (imports back to the same environment)."""
    from ..tasks.envs.formats import export_harbor

    for env in _resolve(ref, runs):
        out = export_harbor(env, dest)
        console.print(f"exported {env.env_id} -> {out}")


@images_app.command("prune")
def images_prune(runs: str = typer.Option("./runs"),
                 all_: bool = typer.Option(False, "--all", help="remove every trajforge environment image")):
    """Remove environment images that no committed build under --runs uses."""
    from ..tasks.envs.catalogue import images_in_use
    from ..tasks.envs.images import prune_images
    from ..tasks.sandbox import docker_client

    if not all_:  # no runs folder here (e.g. another working directory): nothing tells what is in use
        import fsspec

        fs, root = fsspec.core.url_to_fs(runs)
        if not fs.isdir(root):
            fail(f"no runs folder at {runs}: every image would look unused; pass --runs PATH of your builds, "
                 "or --all to remove every trajforge environment image")
    keep: set[str] = set() if all_ else images_in_use(runs)
    removed = prune_images(docker_client(), keep)
    console.print(json.dumps({"removed": len(removed), "kept_in_use": len(keep)}))
