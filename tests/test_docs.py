"""The README and the docs site stay true: the README is a front door (small, the two commands in its first screen,
links that resolve, a config that validates), every `trajforge ...` command the README or a docs page shows exists
(its `--help` runs), and the site builds in mkdocs' strict mode, where a broken link or a page left out of the nav
fails the build. mkdocs is a dev dependency (`make` installs it): a missing mkdocs fails here, it is never skipped."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import mkdocs  # noqa: F401  (a dev dependency: without it this module fails, as it should)
import pytest
import typer.main
import yaml
from typer.testing import CliRunner

from trajforge.flows.cli import app
from trajforge.schemas.config import parse_config

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SNIPPET = re.compile(r'^--8<-- "([^"]+)"\s*$', re.M)
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
INLINE = re.compile(r"`([^`\n]+)`")
PLACEHOLDER = re.compile(r"[A-Z][A-Z_/|.]*")
COMMAND = re.compile(r"(?:^|[\s$(])(?:\S*/)?trajforge((?:[ \t]+[^\s#`]+)*)")


def documents() -> dict[str, str]:
    """README.md and every docs page, with the files the site includes (`--8<--`) read in their place."""
    docs = {"README.md": README.read_text()}
    for page in sorted((ROOT / "docs").glob("*.md")):
        text = page.read_text()
        docs[f"docs/{page.name}"] = SNIPPET.sub(lambda m: (ROOT / m.group(1)).read_text(), text)
    return docs


def documented_commands(text: str) -> set[str]:
    """Every `trajforge ...` command line in a fenced block or an inline code span (prose naming trajforge is not
    a command), as written up to a comment."""
    code = [line for block in FENCE.findall(text) for line in block.splitlines()]
    prose = FENCE.sub("", text)
    code += INLINE.findall(prose)
    found = set()
    for line in code:
        for part in re.split(r"&&|\|\||;", line.split(" #")[0]):  # `a && b`: two commands
            for m in COMMAND.finditer(part):
                found.add(("trajforge" + m.group(1)).strip())
    return found


def subcommand_paths(command: str) -> list[tuple[str, ...]]:
    """The sub-command path(s) a documented command names: words after `trajforge` while the command reached is a
    group (`a|b` names several). A word that is not a sub-command of a group is an error: the docs name a command
    that does not exist."""
    root = typer.main.get_command(app)
    paths: list[tuple[tuple[str, ...], object]] = [((), root)]
    for word in command.split()[1:]:
        groups = [(p, c) for p, c in paths if getattr(c, "commands", None)]
        if not groups or word.startswith(("-", "[")) or PLACEHOLDER.fullmatch(word):
            break  # a leaf command's arguments, options, or a placeholder (`trajforge COMMAND --help`)
        nxt = []
        for path, group in groups:
            for alt in word.split("|"):
                sub = group.commands.get(alt)
                assert sub is not None, (f"{command!r}: `trajforge {' '.join(path)}` has no sub-command {alt!r} "
                                         f"(it has: {', '.join(group.commands)})")
                nxt.append(((*path, alt), sub))
        paths = nxt
    return [p for p, _ in paths]


def test_readme_is_a_front_door():
    """At most 10 KB, the quickstart (`make demo`, `make test`) in its first screen, the docs map linking every
    page of the site."""
    text = README.read_text()
    assert len(text.encode()) <= 10 * 1024, f"README.md is {len(text.encode())} bytes (at most 10 KB)"
    first_screen = "\n".join(text.splitlines()[:20])
    assert "make demo" in first_screen and "make test" in first_screen, "the quickstart is not in README's first 20 lines"
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    pages = set(re.findall(r"[\w-]+\.md", str(nav))) - {"index.md", "benchmarks.md", "integrity-fixtures.md", "deploy.md"}
    missing = sorted(p for p in pages if f"(docs/{p})" not in text)
    assert not missing, f"README's map of docs/ does not link {missing}"


def test_readme_links_resolve():
    """Each relative link of the README names a file of the tree, each `#anchor` one of its headings (the README
    is read on the forge, outside the site's strict build)."""
    text = FENCE.sub("", README.read_text())
    anchors = {re.sub(r"[^\w\- ]", "", h.lower()).strip().replace(" ", "-")
               for h in re.findall(r"^#+ (.+)$", text, re.M)}
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert links, "README links nothing"
    for link in links:
        if re.match(r"[a-z]+://", link):
            continue
        path, _, anchor = link.partition("#")
        if path:
            assert (ROOT / path).exists(), f"README links {link}, which does not exist"
        else:
            assert anchor in anchors, f"README links #{anchor}, which is no heading of it"


def test_readme_config_example_validates():
    """The README's config example is a valid build config (unknown keys are errors)."""
    blocks = re.findall(r"^```yaml\n(.*?)^```", README.read_text(), re.M | re.S)
    assert len(blocks) == 1, "README has one config example"
    cfg = parse_config(yaml.safe_load(blocks[0]), source="README.md")
    assert cfg.dataset == "demo"


def test_every_documented_command_exists():
    """Each `trajforge ...` command shown in README.md or docs/ names real sub-commands, and their `--help` runs."""
    commands = {cmd: name for name, text in documents().items() for cmd in documented_commands(text)}
    assert len(commands) >= 20, f"too few commands found ({len(commands)}): is the extraction broken?"
    paths = {path for cmd in commands for path in subcommand_paths(cmd)}
    for path in sorted(paths):
        result = CliRunner().invoke(app, [*path, "--help"])
        assert result.exit_code == 0 and "Usage" in result.output, f"trajforge {' '.join(path)} --help: {result.output}"
    assert not _leaves(typer.main.get_command(app)) - paths, (
        f"commands no page documents: {sorted(_leaves(typer.main.get_command(app)) - paths)}")


def _leaves(command, path: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    subs = getattr(command, "commands", None)
    return {q for name, sub in subs.items() for q in _leaves(sub, (*path, name))} if subs else {path}


def test_the_trajforge_command_is_installed():
    """The documented entry point runs (the console script of pyproject's `[project.scripts]`)."""
    exe = shutil.which("trajforge", path=str(Path(sys.executable).parent))
    assert exe, f"no trajforge script beside {sys.executable}"
    out = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "build" in out.stdout, out.stderr


def _mkdocs(config: Path, site: Path) -> subprocess.CompletedProcess:
    # cwd: the repository root, where the site's `--8<--` includes are looked up
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


def test_docs_site_builds_strict(tmp_path):
    """`make docs`: the site builds with no warning (no broken link or anchor, no page outside the nav)."""
    out = _mkdocs(ROOT / "mkdocs.yml", tmp_path / "site")
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "site" / "verification" / "index.html").exists()
    included = (tmp_path / "site" / "benchmarks" / "index.html").read_text()
    assert "--8&lt;--" not in included and "Benchmarks" in included, "benchmarks/README.md was not included"


@pytest.mark.parametrize("breakage, named", [
    ("pages", ["no-such-page.md", "#no-such-heading", "orphan.md"]), ("include", ["no/such.md"])])
def test_docs_site_fails_on_a_broken_link(tmp_path, breakage, named):
    """The strict build is what catches them: a broken link, a missing anchor and a page outside the nav each fail
    it, named in its output (one build reports all three); so does an include of a missing file."""
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs)
    index = docs / "index.md"
    if breakage == "pages":
        index.write_text(index.read_text() + "\n[gone](no-such-page.md) [moved](gates.md#no-such-heading)\n")
        (docs / "orphan.md").write_text("# Orphan\n")
    else:
        index.write_text(index.read_text() + '\n--8<-- "no/such.md"\n')
    config = tmp_path / "mkdocs.yml"
    text = (ROOT / "mkdocs.yml").read_text()
    assert re.search(r"^docs_dir: docs$", text, re.M)
    config.write_text(re.sub(r"^docs_dir: docs$", f"docs_dir: {docs}", text, flags=re.M))
    out = _mkdocs(config, tmp_path / "site")
    assert out.returncode != 0, out.stderr
    for name in named:
        assert name in out.stderr + out.stdout, f"{name} not named: {out.stderr}"

def test_a_command_that_does_not_exist_is_caught():
    """The check above fails on a documented sub-command the CLI lacks, and reads alternatives and placeholders."""
    with pytest.raises(AssertionError, match="no sub-command 'bogus'"):
        subcommand_paths("trajforge envs bogus DIR")
    with pytest.raises(AssertionError, match="no sub-command 'restart'"):
        subcommand_paths("trajforge stack up|restart")
    assert subcommand_paths("trajforge stack up|down") == [("stack", "up"), ("stack", "down")]
    assert subcommand_paths("trajforge envs import ./corpus --jobs 4") == [("envs", "import")]
    assert subcommand_paths("trajforge COMMAND --help") == [()]
    assert documented_commands("run `trajforge status` or:\n```bash\ntrajforge stack down && trajforge stack up\n```\n"
                               "trajforge flags hacks") == {"trajforge status", "trajforge stack down", "trajforge stack up"}
