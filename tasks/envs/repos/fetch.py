"""Where a repository source's code comes from (issue 43): a local git repository, a project folder (one revision),
or a PyPI project's released sdists, fetched as users fetch code (`pip download --no-deps --no-binary :all:`) and
made a history by `history.releases_as_history`.

Invariants:
- Fetched and made histories are cached under `$TRAJFORGE_CACHE/repos/<digest of what was asked>`: the same
  project and versions give the same folder and the same commit ids (a second plan reads, never re-downloads).
- An sdist is unpacked through tarfile's `data` filter (no absolute path, no link out, no device) or zipfile with
  each name checked; its single top folder is the version's tree. Nothing is half-written: a history is built in a
  temporary folder and renamed (`releases_as_history`), a failed download leaves nothing.
- Errors are `SourceError` naming the project, the version and pip's last lines.
- `TRAJFORGE_OFFLINE=1`: nothing is downloaded or cloned; a source not in the cache is a `SourceError` saying how to
  fetch it (`trajforge envs fetch CONFIG`, which `make bench` runs first: benchmarks and tests reach no registry).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path, PurePosixPath

from ...engine.cache import cache_root as trajforge_cache
from .history import RepositoryError, open_repository, releases_as_history


class SourceError(RuntimeError):
    """A repository source that cannot be had (not a folder, a version pip cannot download, a bad sdist)."""


def offline() -> bool:
    return os.environ.get("TRAJFORGE_OFFLINE", "") not in ("", "0")


def _not_cached(what: str) -> SourceError:
    return SourceError(f"{what}: not in the cache ({cache_root()}) and TRAJFORGE_OFFLINE is set: fetch it first "
                       "(`trajforge envs fetch CONFIG`)")


def cache_root() -> Path:
    return trajforge_cache() / "repos"


def _unpack(archive: Path, into: Path) -> Path:
    """The single top folder of an unpacked sdist."""
    into.mkdir(parents=True)
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as z:
            for name in z.namelist():
                if name.startswith("/") or ".." in PurePosixPath(name).parts:
                    raise SourceError(f"{archive.name}: an entry outside the archive's folder: {name!r}")
            z.extractall(into)
    else:
        try:
            with tarfile.open(archive) as tar:
                tar.extractall(into, filter="data")
        except (tarfile.TarError, OSError) as e:
            raise SourceError(f"{archive.name}: cannot be unpacked: {e}") from e
    tops = [p for p in into.iterdir()]
    if len(tops) != 1 or not tops[0].is_dir():
        raise SourceError(f"{archive.name}: not one top folder ({len(tops)} entries)")
    return tops[0]


def download_sdist(name: str, version: str, dest: Path) -> Path:
    """The sdist of `name==version` downloaded into `dest` (pip, no dependencies, source only)."""
    dest.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                           "--disable-pip-version-check", f"{name}=={version}", "-d", str(dest)],
                          capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    found = [p for p in dest.iterdir() if p.name.endswith((".tar.gz", ".zip", ".tar.bz2", ".tgz"))]
    if proc.returncode or len(found) != 1:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        raise SourceError(f"pypi {name}=={version}: pip download failed: {tail or 'no sdist'}")
    return found[0]


def pypi_history(name: str, versions: list[str]) -> Path:
    """A git repository with one commit per released version of `name` (oldest first, as given), cached."""
    key = hashlib.sha256(json.dumps(["pypi", name, versions]).encode()).hexdigest()[:16]
    dest = cache_root() / f"pypi-{name}-{key}"
    if (dest / ".git").is_dir():
        return dest
    if offline():
        raise _not_cached(f"pypi {name} {', '.join(versions)}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="trajforge-sdists-") as tmp:
        trees = []
        for version in versions:
            archive = download_sdist(name, version, Path(tmp) / "dl" / version)
            trees.append((version, _unpack(archive, Path(tmp) / "src" / version)))
        try:
            releases_as_history(trees, dest)
        except RepositoryError as e:
            if (dest / ".git").is_dir():  # another process made it meanwhile
                return dest
            raise SourceError(str(e)) from e
    return dest


def folder_history(folder: Path) -> Path:
    """A project folder that is not a git repository, as a history of one commit (cached by its content)."""
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file() and not p.is_symlink():
            h.update(p.relative_to(folder).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    dest = cache_root() / f"folder-{folder.name}-{h.hexdigest()[:16]}"
    if not (dest / ".git").is_dir():
        try:
            releases_as_history([("snapshot", folder)], dest)
        except RepositoryError as e:
            if not (dest / ".git").is_dir():
                raise SourceError(str(e)) from e
    return dest


def clone(url: str) -> Path:
    """A git URL cloned once into the cache (`git clone --quiet --no-recurse-submodules`, no prompt, no hooks)."""
    dest = cache_root() / f"git-{hashlib.sha256(url.encode()).hexdigest()[:16]}"
    if (dest / ".git").is_dir():
        return dest
    if url.startswith("-"):
        raise SourceError(f"not a URL: {url!r}")
    if offline():
        raise _not_cached(url)
    part = Path(tempfile.mkdtemp(prefix=dest.name + ".", suffix=".partial", dir=cache_root()))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    proc = subprocess.run(["git", "-c", "core.hooksPath=/dev/null", "clone", "--quiet", "--no-recurse-submodules",
                           "--", url, str(part / "repo")], capture_output=True, text=True, timeout=900,
                          stdin=subprocess.DEVNULL, env={**env, "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"})
    if proc.returncode:
        shutil.rmtree(part, ignore_errors=True)
        raise SourceError(f"{url}: git clone failed: {(proc.stderr.strip().splitlines() or ['no message'])[-1]}")
    try:
        (part / "repo").rename(dest)
    except OSError:  # another process cloned it meanwhile
        pass
    shutil.rmtree(part, ignore_errors=True)
    return dest


def repository_path(path: str | None, pypi: str | None, versions: list[str]) -> Path:
    """The git repository a source names: `path` itself when it is one, a one-commit history of a project folder,
    a clone of a git URL (`https://...`, `git@host:...`), or the history of `pypi`'s released `versions`."""
    if pypi is not None:
        return pypi_history(pypi, versions)
    if path and ("://" in path or path.startswith("git@")):
        cache_root().mkdir(parents=True, exist_ok=True)
        return clone(path)
    folder = Path(path or "").expanduser()
    if not folder.is_dir():
        raise SourceError(f"{folder}: not a folder")
    try:
        return open_repository(folder).path
    except RepositoryError:
        return folder_history(folder.resolve())


def clear(dest: Path) -> None:
    """Forget a cached history (a test's, or one to fetch again)."""
    shutil.rmtree(dest, ignore_errors=True)
