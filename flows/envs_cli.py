"""`trajforge envs ...` and `trajforge images ...`: environments outside a build.

envs families | sample FAMILY --level L --seed S | validate PATH|ID | audit PATH|ID | import DIR | export ID DIR
images prune [--all] | base add NAME --from-debootstrap SUITE [--mirror URL] [--alias PATTERN]

An environment ID is a procedural one (`family-l<level>-s<seed>`, optionally with its content-hash
suffix) or the env_id of an environment committed in a build under `--runs`. `validate` and `import`
run the same validator as a build (settings from `--config`, else the defaults).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from ..schemas.environment import EnvSpec
from .console import console, err_console, fail
from .envs_repo import envs_fetch, envs_from_repo
from .envs_settings import validate_all, validator_settings

envs_app = typer.Typer(no_args_is_help=True, help="Environment families and environments.")
images_app = typer.Typer(no_args_is_help=True, help="Content-addressed environment images.")


@envs_app.command("families")
def envs_families():
    """List the procedural environment families: kind (`terminal` / `tools`), levels, what the agent does."""
    from ..tasks.envs.families import FAMILIES

    t = Table(title="environment families")
    for col in ("family", "kind", "levels", "what the agent does"):
        t.add_column(col)
    for f in FAMILIES.values():
        t.add_row(f.name, f.kind, ", ".join(map(str, f.levels)), f.description)
    console.print(t)


@envs_app.command("sample")
def envs_sample(family: str, level: int = typer.Option(1, "--level"), seed: int = typer.Option(0, "--seed"),
                tests: bool = typer.Option(False, "--tests", help="include the hidden tests"),
                full: bool = typer.Option(False, "--full", help="a tool environment's whole spec (server, tools.py)"),
                harness: list[str] = typer.Option([], "--harness", help="show how an episode starts under this "
                                                  "harness (repeat it; `all`: every harness that drives the kind)"),
                tool_calling: bool = typer.Option(True, "--tool-calling/--fenced",
                                                  help="with --harness: tool calls (default) or fenced blocks")):
    """Print one generated environment as JSON: instruction, files, solution; for a `tools` family the
    instruction, the tools offered and the oracle calls (`--full`: the whole spec). With `--harness`: how an
    episode of it starts under each harness named (system prompt, instruction, tools offered)."""
    from ..tasks.envs.families import get_family
    from ..tasks.envs.kinds import of as kind_of

    try:
        env = get_family(family).generate(level, seed)
    except (KeyError, ValueError) as err:
        fail(str(err).strip("'\""))
    if harness:
        console.print_json(json.dumps(_episode_starts(env, harness, tool_calling)))
        return
    view = kind_of(env).view
    if view is not None and not full:
        console.print_json(json.dumps(view(env, tests)))
        return
    console.print_json(env.model_dump_json(exclude=None if tests else {"tests"}))


def _episode_starts(env: EnvSpec, names: list[str], tool_calling: bool) -> dict:
    from ..schemas.config import RolloutConfig
    from ..tasks.agent.harness import EpisodeSettings, episode_start
    from ..tasks.agent.harnesses import HARNESSES

    if names == ["all"]:
        names = [n for n, h in sorted(HARNESSES.items()) if env.kind in h.kinds]
    unknown = [n for n in names if n not in HARNESSES]
    if unknown:
        fail(f"unknown harness {', '.join(map(repr, unknown))}; registered: {', '.join(sorted(HARNESSES))}")
    wrong = [n for n in names if env.kind not in HARNESSES[n].kinds]
    if wrong:
        fail(f"harness {', '.join(wrong)} does not drive {env.kind!r} environments; these do: "
             f"{', '.join(n for n, h in sorted(HARNESSES.items()) if env.kind in h.kinds)}")
    r = RolloutConfig()
    s = EpisodeSettings(max_turns=r.max_turns, command_timeout_s=r.command_timeout_s,
                        episode_timeout_s=r.episode_timeout_s, tool_calling=tool_calling)
    return {"env_id": env.env_id, "kind": env.kind, "starts": [episode_start(env, n, s) for n in names]}


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


def _report(results, title: str) -> int:
    from ..tasks.envs.validator import check_names

    CHECKS = check_names()
    t = Table(title=title)
    for col in ("environment", "source", *CHECKS, "verdict"):
        t.add_column(col)
    mark = {"pass": "[green]pass[/]", "fail": "[red]fail[/]", "skip": "skip", "flag": "[yellow]flag[/]"}
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
    s, sandbox = validator_settings(config)
    envs = _resolve(ref, runs)
    rejected = _report(validate_all(envs, s, sandbox, jobs), f"validation of {ref}")
    raise typer.Exit(1 if rejected else 0)


@envs_app.command("audit")
def envs_audit(ref: str = typer.Argument(..., help="task folder(s), family-l<L>-s<S>, or a committed env_id"),
               config: Optional[Path] = typer.Option(None, help="take validator settings from this build config"),
               runs: str = typer.Option("./runs"),
               mutants: Optional[int] = typer.Option(None, help="the most mutants per environment (default: "
                                                                 "synthesize.audit_mutants)")):
    """Attack each environment's hidden tests with wrong states derived from its reference solution (every
    validator check runs first): print each mutant and its verdict; exit 1 if any environment's tests pass a
    mutant (`weak_tests`) or it is rejected for another reason."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from ..tasks.envs.audit import AuditSettings
    from ..tasks.envs.validator import validate_configured
    from ..tasks.sandbox import docker_client

    s, sandbox = validator_settings(config)
    budget = mutants or s.audit_mutants
    envs = _resolve(ref, runs)
    try:
        client = docker_client(pool_size=8, sandbox=sandbox)
    except Exception as err:
        fail(str(err), 1)
    mark = {"killed": "[green]killed[/]", "survived": "[red]survived[/]", "equivalent": "[dim]equivalent[/]",
            "not_built": "[yellow]not built[/]"}
    bad = 0
    for env in envs:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), console=console) as bar:
            task = bar.add_task(f"{env.env_id}: validating", total=budget)

            def said(m, bar=bar, task=task, name=env.env_id) -> None:
                bar.update(task, description=f"{name}: auditing", advance=m.outcome in ("killed", "survived"))
                bar.console.print(f"  {mark[m.outcome]} {m.mutator} {m.path}: {m.what}"
                                  + (f"\n      {m.cause.splitlines()[0][:200]}" if m.cause else ""), highlight=False)

            v = validate_configured(client, env, s, sandbox, audit=AuditSettings("flag", budget, progress=said))
        a = env.audit
        if not v.ok:
            bad += 1
            console.print(f"[red]✗[/] {env.env_id}: {v.reject.reason}: {v.reject.detail}")
        elif a.status == "weak":
            bad += 1
            console.print(f"[red]✗[/] {env.env_id}: weak_tests: {len(a.survivors)} of {a.tried} mutants survived "
                          f"({a.test_runs} test runs, {a.seconds:.1f} s)")
        else:
            console.print(f"[green]✓[/] {env.env_id}: {a.status}"
                          + (f" ({a.reason})" if a.reason else f", {a.killed}/{a.tried} mutants killed")
                          + f" ({a.test_runs} test runs, {a.seconds:.1f} s of {v.seconds:.1f} s validation)")
    raise typer.Exit(1 if bad else 0)


@envs_app.command("import")
def envs_import(folder: Path = typer.Argument(..., help="a Harbor / Terminal-Bench task folder, an MCP server folder (mcp-env.yaml: a server/ folder or a pinned package), or a folder of them"),
                out: Optional[Path] = typer.Option(None, help="write the admitted environments here (JSONL)"),
                config: Optional[Path] = typer.Option(None), jobs: int = typer.Option(2, help="builds at once"),
                sample: Optional[int] = typer.Option(None, help="try a seeded sample of N task folders first"),
                seed: int = typer.Option(0, help="seed of --sample"),
                ca_bundle: Optional[Path] = typer.Option(None, help="host CA bundle for networked builds "
                                                                     "(overrides synthesize.build.ca_bundle; "
                                                                     "default: the host's SSL_CERT_FILE / "
                                                                     "PIP_CERT / REQUESTS_CA_BUNDLE)"),
                state: Optional[Path] = typer.Option(None, help="journal of outcomes (resume); default "
                                                                 "$TRAJFORGE_CACHE/imports/import-<hash of FOLDER and "
                                                                 "settings>.jsonl (~/.cache/trajforge), never inside "
                                                                 "the folder being imported"),
                fresh: bool = typer.Option(False, help="ignore the journal: check every task again"),
                log_dir: Path = typer.Option(Path(".trajforge/build-logs"), help="build logs, one per image")):
    """Import task folders through the validator (a build takes them with `synthesize.imports`): parse all,
    build and validate through a pool with a progress bar, resume from the journal, print yield by reason."""
    import hashlib
    import time

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ..tasks.envs.catalogue import merge_candidates
    from ..tasks.envs.corpus import Journal, admit, discover, parse, tally
    from ..tasks.envs.formats import TaskFormatError
    from ..tasks.envs.images import CA_HINT, CERT_ERROR, HOST_CA_VARS, host_ca_bundle
    from ..tasks.teachers.vllm_server import cache_dir

    s, sandbox = validator_settings(config)
    if ca_bundle:
        s = s.model_copy(update={"build": s.build.model_copy(update={"ca_bundle": str(ca_bundle)})})
    elif not s.build.ca_bundle and (host := host_ca_bundle()):
        console.print(f"networked builds use the host's CA bundle {host} (from {'/'.join(HOST_CA_VARS)}; "
                      "--ca-bundle overrides)")
    t0 = time.monotonic()
    try:
        folders = discover(folder, sample, seed)
    except TaskFormatError as err:
        fail(str(err))
    if not folders:
        fail(f"{folder}: no task folder there")
    envs, malformed = parse(folders)
    console.print(f"parsed {len(folders)} task folder(s) in {time.monotonic() - t0:.1f}s: {len(envs)} readable, "
                  f"{len(malformed)} malformed" + (f" (sample of {sample}, seed {seed})" if sample else ""))
    for o in malformed:
        err_console.print(f"[red]✗[/] {o.detail}")
    unique, conflicts = merge_candidates([e for _, e in envs])
    for r in conflicts:  # two folders, one env id, two contents: the first is imported, the other named here
        err_console.print(f"[red]✗[/] {r.reason}: {r.detail}")
    settings = json.dumps([str(folder.resolve()), s.model_dump(mode="json"), sandbox.model_dump(mode="json")],
                          sort_keys=True)  # other settings, another journal
    digest = hashlib.sha256(settings.encode()).hexdigest()[:12]
    # the journal decides what is NOT validated again: it lives in the user's cache, not in the working
    # directory, where a downloaded snapshot could bring one along
    default = cache_dir() / "imports" / f"import-{digest}.jsonl"
    journal = Journal(None if fresh and state is None else (state or default))
    if fresh:
        journal.done.clear()
    resumed = sum(journal.holds(e) for e in unique)
    if resumed:
        console.print(f"resuming: {resumed} environment(s) already checked (journal {journal.path})")
    failures: dict[str, int] = {}
    t1 = time.monotonic()
    built = [0]
    with Progress(TextColumn("[bold]import"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[rate]}"), TextColumn("{task.fields[why]}"), console=console,
                  transient=False) as bar:
        task = bar.add_task("import", total=len(unique) - resumed, rate="", why="")

        def on_result(o) -> None:
            built[0] += int(o.built)
            if not o.kept:
                failures[o.cause or o.outcome] = failures.get(o.cause or o.outcome, 0) + 1
            minutes = max(time.monotonic() - t1, 1e-6) / 60
            bar.update(task, advance=1, rate=f"{built[0] / minutes:.1f} images/min",
                       why=", ".join(f"{k}={v}" for k, v in sorted(failures.items(), key=lambda kv: -kv[1])))

        outcomes = admit(unique, s, sandbox, jobs, journal, on_result, log_dir)
    by_id = {o.key: o for o in outcomes}
    if len(outcomes) <= 40:
        _outcome_table(outcomes, f"import of {folder}")
    for o in outcomes:
        if not o.kept:
            console.print(f"[red]✗[/] {o.key}: {o.outcome}: {o.detail[:400]}")
    _yield_table(tally([*outcomes, *malformed]))
    if tls := sum(not o.kept and bool(CERT_ERROR.search(o.detail)) for o in outcomes):
        err_console.print(f"[red]{tls} image build(s) failed a certificate check[/]: {CA_HINT}")
    if out:
        kept = [by_id[e.env_id].spec for e in unique if by_id.get(e.env_id) and by_id[e.env_id].kept]
        out.write_text("".join(k + "\n" for k in kept if k))
        console.print(f"wrote {len(kept)} environment(s) to {out}")
    console.print(f"build logs: {log_dir}/<image>.log · wall time {time.monotonic() - t0:.1f}s")
    raise typer.Exit(1 if malformed or any(not o.kept for o in outcomes) else 0)


def _outcome_table(outcomes, title: str) -> None:
    t = Table(title=title)
    for col in ("environment", "source", "oracle", "verdict"):
        t.add_column(col)
    for o in sorted(outcomes, key=lambda o: o.key):
        t.add_row(o.key, o.source, o.oracle, "[green]kept[/]" if o.kept else f"[red]{o.outcome}[/]")
    console.print(t)


def _yield_table(by_source: dict[str, dict[str, int]]) -> None:
    t = Table(title="yield per source")
    for col in ("source", "candidates", "kept (oracle)", "kept (no oracle)", "yield", "rejected by reason"):
        t.add_column(col)
    for source, counts in sorted(by_source.items()):
        total = sum(counts.values())
        k1, k2 = counts.get("kept (oracle)", 0), counts.get("kept (no oracle)", 0)
        why = ", ".join(f"{k}={v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]) if not k.startswith("kept"))
        t.add_row(source, str(total), str(k1), str(k2), f"{(k1 + k2) / total:.0%}" if total else "-", why)
    console.print(t)


@envs_app.command("export")
def envs_export(ref: str = typer.Argument(..., help="family-l<L>-s<S> or a committed env_id"),
                dest: Path = typer.Argument(..., help="folder to write the Harbor task folder into"),
                runs: str = typer.Option("./runs")):
    """Write an environment as a Harbor task folder (imports back to the same environment)."""
    from ..tasks.envs.formats import export_harbor

    for env in _resolve(ref, runs):
        out = export_harbor(env, dest)
        console.print(f"exported {env.env_id} -> {out}")


base_app = typer.Typer(no_args_is_help=True, help="Local base images that registry `FROM` images map to.")
images_app.add_typer(base_app, name="base")


@base_app.command("add")
def images_base_add(name: str = typer.Argument(..., help="tags trajforge/base-NAME:latest"),
                    from_debootstrap: str = typer.Option(..., "--from-debootstrap", metavar="SUITE",
                                                         help="e.g. bookworm, trixie, or noble with an Ubuntu --mirror"),
                    mirror: str = typer.Option("http://deb.debian.org/debian"),
                    components: str = typer.Option("main", help="e.g. main,universe for Ubuntu"),
                    alias: list[str] = typer.Option([], help="FROM pattern(s) this base stands in for, e.g. "
                                                             "'*/ubuntu-24-04:*' (printed as config lines)")):
    """Build another local base image offline (debootstrap + docker import + the agent layer) and print the
    `synthesize.image_aliases` lines that map registry images to it."""
    import os
    import re
    import subprocess

    if not re.fullmatch(r"[a-z0-9][a-z0-9._-]*", name):
        fail(f"NAME {name!r}: use lower-case letters, digits and ._- (it becomes trajforge/base-NAME)")
    script = Path(__file__).resolve().parents[1] / "deploy" / "images" / "add-base.sh"
    proc = subprocess.run(["bash", str(script), name, from_debootstrap, mirror], env={**os.environ,
                          "COMPONENTS": components}, capture_output=True, text=True)
    if proc.returncode != 0:
        fail(f"base image {name} from {from_debootstrap} ({mirror}) did not build:\n{(proc.stdout + proc.stderr)[-1500:]}", 1)
    console.print(proc.stdout.strip())
    tag = f"trajforge/base-{name}:latest"
    console.print("add to your build config (the mapping is recorded on each environment as `base_images`):")
    console.print("synthesize:\n  image_aliases:")
    for pattern in alias or ["<registry pattern>"]:
        console.print(f'    "{pattern}": "{tag}"')


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


envs_app.command("from-repo")(envs_from_repo)
envs_app.command("fetch")(envs_fetch)
