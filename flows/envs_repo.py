"""`trajforge envs from-repo PATH_OR_URL`: software-engineering environments from one repository, outside a build;
`trajforge envs fetch CONFIG`: every repository a build config names, fetched into the cache now (a build that
runs later, or offline, reads the cache and downloads nothing).

PATH_OR_URL: a local git repository or project folder, a git URL, or `pypi:NAME` with `--versions` (released sdists
as the history). The same code as `synthesize.repos` in a build (tasks/envs/repos): plan the items, build each
task's image, run its suite before and after the reference solution, then (unless `--no-validate`) the validator
every build runs. Prints a progress bar, each reject with its reason, and the yield by reason.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer
from pydantic import ValidationError
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..schemas.config import RepoSourceConfig
from ..schemas.environment import EnvSpec
from .console import console, err_console, fail
from .envs_settings import validate_all, validator_settings


def envs_from_repo(
        source: str = typer.Argument(..., help="a git repository or project folder, a git URL, or pypi:NAME"),
        versions: Optional[str] = typer.Option(None, help="with pypi:NAME, released versions oldest first (a,b,c)"),
        commits: int = typer.Option(10, help="the most commit tasks tried"),
        bugs: int = typer.Option(10, help="the most planted-bug tasks tried"),
        seed: int = typer.Option(0), revisions: Optional[str] = typer.Option(None, help="a git revision range"),
        no_install: bool = typer.Option(False, "--no-install", help="install no dependency (the base image's pytest)"),
        config: Optional[Path] = typer.Option(None, help="take sandbox, build and validator settings from it"),
        validate: bool = typer.Option(True, help="run the validator on each environment made"),
        out: Optional[Path] = typer.Option(None, help="write the admitted environments here (JSONL)"),
        jobs: int = typer.Option(1, help="validations at once")):
    """Environments from a repository's commits and from bugs planted in its code."""
    from ..tasks.envs.repos.fetch import SourceError
    from ..tasks.envs.repos.history import RepositoryError
    from ..tasks.envs.repos.make import make_env
    from ..tasks.envs.repos.plan import items
    from ..tasks.envs.repos.probe import SuiteTooSlow
    from ..tasks.sandbox import docker_client
    from ..tasks.synthesize import build_options

    s, sandbox = validator_settings(config)
    pypi = source[5:] if source.startswith("pypi:") else None
    try:
        cfg = RepoSourceConfig(path=None if pypi else source, pypi=pypi, seed=seed, commits=commits, bugs=bugs,
                               versions=[v for v in (versions or "").split(",") if v], revisions=revisions,
                               project={"install": []} if no_install else {})
    except ValidationError as err:
        fail("; ".join(e["msg"] for e in err.errors()))
    t0 = time.monotonic()
    try:
        todo, skipped = items(0, cfg)
    except (SourceError, RepositoryError, OSError) as err:
        fail(str(err))
    console.print(f"{cfg.label}: {len(todo)} task(s) to try ({sum(i['task'] == 'commit' for i in todo)} commits, "
                  f"{sum(i['task'] == 'planted_bug' for i in todo)} planted bugs); skipped: "
                  + (", ".join(f"{k}={v}" for k, v in sorted(skipped.items())) or "none"))
    client = docker_client(pool_size=4, sandbox=sandbox)
    made: list[EnvSpec] = []
    reasons: dict[str, int] = {}
    infra = 0  # items not decided: the solved state's suite ran past `test_timeout_s` (run again later)
    with Progress(TextColumn("[bold]from-repo"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[why]}"), console=console) as bar:
        task = bar.add_task("from-repo", total=len(todo), why="")
        for item in todo:
            try:
                env = make_env(client, 0, cfg, item, sandbox, build_options(s), s.image_aliases)
            except SuiteTooSlow as err:  # infrastructure, not the item's fault: counted apart, never a reject
                infra += 1
                err_console.print(f"[yellow]![/] {item['task']} {item.get('sha') or item.get('rev', '')[:12]}: "
                                  f"not decided (infrastructure): {err}")
                bar.update(task, advance=1)
                continue
            if isinstance(env, EnvSpec):
                made.append(env)
            else:
                reasons[env.reason] = reasons.get(env.reason, 0) + 1
                err_console.print(f"[red]✗[/] {env.key}: {env.reason}: {env.detail[:300]}")
            bar.update(task, advance=1, why=f"made {len(made)} " + " ".join(f"{k}={v}" for k, v in reasons.items()))
    kept = made
    if validate and made:
        results = validate_all(made, s, sandbox, jobs)
        kept = [env for env, v in results if v.ok]
        for env, v in results:
            if not v.ok:
                reasons[v.reject.reason] = reasons.get(v.reject.reason, 0) + 1
                err_console.print(f"[red]✗[/] {env.env_id}: {v.reject.reason}: {v.reject.detail[:300]}")
    by_kind: dict[str, int] = {}
    for env in kept:
        kind = "commit" if "-commit-" in env.env_id else "planted_bug"
        by_kind[kind] = by_kind.get(kind, 0) + 1
    console.print(f"kept {len(kept)} of {len(todo)} ({', '.join(f'{k}={v}' for k, v in sorted(by_kind.items()))}); "
                  f"rejected: {', '.join(f'{k}={v}' for k, v in sorted(reasons.items())) or 'none'}; "
                  + (f"not decided (infrastructure, run again): {infra}; " if infra else "")
                  + f"{time.monotonic() - t0:.0f}s")
    if out:
        out.write_text("".join(e.model_dump_json() + "\n" for e in kept))
        console.print(f"wrote {len(kept)} environment(s) to {out}")
    raise typer.Exit(0 if kept else 1)


def envs_fetch(config: Path = typer.Argument(..., help="a build config with `synthesize.repos`")):
    """Fetch every repository of CONFIG's `synthesize.repos` into the trajforge cache (sdists, clones, histories)."""
    from ..schemas.config import ConfigError, load_config
    from ..tasks.envs.repos.fetch import SourceError, repository_path
    from ..tasks.envs.repos.history import RepositoryError, open_repository

    try:
        repos = load_config(config).synthesize.repos
    except (ConfigError, OSError) as err:
        fail(str(err))
    if not repos:
        fail(f"{config}: synthesize.repos is empty: nothing to fetch")
    for cfg in repos:
        t0 = time.monotonic()
        try:
            path = repository_path(cfg.path, cfg.pypi, cfg.versions)
            head = open_repository(path).head
        except (SourceError, RepositoryError, OSError) as err:
            fail(f"{cfg.label}: {err}")
        console.print(f"{cfg.label}: {path} at {(head or 'no commit')[:12]} ({time.monotonic() - t0:.1f}s)")
