"""A brought MCP server pinned as a package (`package:` in an `mcp-server` folder's `mcp-env.yaml`): the lock.

`package: {pip: "NAME==VERSION"}` or `package: {npm: "NAME@VERSION"}`, an exact version (ranges, URLs, paths, git
refs and tags are refused naming the field). On import, on the host, the pin is resolved ONCE, with its
dependencies, from the registry the user has configured (pip: `PIP_INDEX_URL` / pip.conf; npm:
`npm_config_registry` / .npmrc), into a lock: name, version, file and sha256 (npm: also the registry's
`integrity`) of every artifact. The lock is the environment's `.tools/package.lock.json`, so the env id and the
image tag follow it: the same pin with the same bytes is the same environment, a republished artifact another.

- pip: `pip download` for the image's Python (CPython 3.11, manylinux x86_64: the tools layer's `PLATFORM`),
  binary wheels only (an sdist-only pin or dependency is refused, named: building it would run its code). A wheel
  identical to one of the tools layer's (`mcp` and its closure: same name, version and sha256) is marked
  `in_tools_layer` and not installed again: the server finds it on the SDK's path.
- npm: `npm install --package-lock-only --ignore-scripts --omit=dev` resolves the tree (paths below
  `node_modules/`, bins), `npm pack` fetches each tarball. Install scripts are never run (the lock lists the
  packages that have some: `install_scripts`); a package that needs them to work fails validation. A tarball
  holding anything but regular files and directories, an absolute or `..` member is refused (`npm_members`).
- Only registry dependencies: the tree is walked through the index's metadata (pip: `--no-deps` downloads, each
  wheel's METADATA; npm: `npm view` of each manifest), refusing a pip direct-URL requirement (`NAME @ URL`) and
  an npm spec that is not a registry version or range (`registry_spec`), named, before anything is fetched from
  elsewhere. For pip the walk IS the resolution (pip's resolver never runs: backtracking, it fetched direct URLs
  and prepared VCS checkouts with their build backends on the host): first choices that do not agree, or a tree
  of over MAX_WHEELS distributions, are refused by name. npm's lock is checked again (`resolved` under the
  registry).

The artifacts are cached on the host ($TRAJFORGE_CACHE, `~/.cache/trajforge`: `wheels/<lock hash>` as the tools
layer's own wheelhouse, `npm/<lock hash>`); the image build (`tasks/envs/tools/layer.py`, the package layer)
takes them from there, downloading them again from the registry if absent, and refuses any whose bytes differ
from the lock (`ArtifactMismatch`, naming the artifact). Inside the image they are installed with no network:
pip `--no-index --require-hashes --no-deps` into `PKG_DIR/site` (console scripts in `PKG_DIR/bin`), npm
tarballs unpacked on the host (regular files and folders only, again) and copied to their paths below
`PKG_DIR/node_modules` (the pinned package's bins linked in `PKG_DIR/bin`).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import posixpath
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
import zipfile
from email.parser import HeaderParser
from pathlib import Path

from .layer import (
    PLATFORM,
    ArtifactMismatch,
    ToolsLayerError,
    UnsafeArtifact,
    cache_root,
    lock_text,
    wheelhouse,
    wheelhouse_dir,
)

LOCK_FILE = "package.lock.json"  # in .tools/
PKG_DIR = "/opt/trajforge/pkg"  # the pinned package, installed at image build (root-owned, read-only to the agent)
MANAGERS = {"pip": "python", "npm": "node"}
PIP_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")
NPM_NAME = re.compile(r"^(@[a-z0-9][a-z0-9._~-]*/)?[a-z0-9][a-z0-9._~-]*$")
VERSION = re.compile(r"^[0-9][A-Za-z0-9.+_-]*$")
TIMEOUT_S = 600


class PackageError(ValueError):
    """A pin that cannot be locked (malformed, not in the registry, registry unreachable, sdist only): the
    message names the package, the version and the registry."""


def parse_pin(value) -> tuple[str, str, str]:
    """(manager, name, version) of a `package:` field; PackageError (naming the field) unless it pins exactly."""
    if not isinstance(value, dict) or len(value) != 1 or next(iter(value)) not in MANAGERS:
        raise PackageError("field `package` must be {pip: \"NAME==VERSION\"} or {npm: \"NAME@VERSION\"}")
    manager, spec = next(iter(value.items()))
    if not isinstance(spec, str):
        raise PackageError(f"field `package.{manager}` must be a string, got {spec!r}")
    spec = spec.strip()
    if manager == "pip":
        name, sep, version = spec.partition("==")
        ok = sep and PIP_NAME.match(name.strip()) and VERSION.match(version.strip()) and "=" not in version
        example = "NAME==VERSION, e.g. counters-mcp==1.0.0"
    else:
        name, sep, version = spec.rpartition("@")
        ok = sep and NPM_NAME.match(name) and VERSION.match(version) and re.match(r"^\d+\.\d+\.\d+", version)
        example = "NAME@VERSION, e.g. counters-mcp@1.0.0"
    if not ok:
        raise PackageError(f"field `package.{manager}` must pin one exact version ({example}): {spec!r} is a range, "
                           "a URL, a path, a tag or a git reference")
    return manager, name.strip(), version.strip()


def lock_of(files) -> dict | None:
    """The package lock an environment's files carry (`.tools/package.lock.json`), None for a server folder."""
    text = next((f.content for f in files if f.path.strip("/") == f".tools/{LOCK_FILE}"), None) if files else None
    return json.loads(text) if text else None


def resolve(manager: str, name: str, version: str) -> tuple[dict, str]:
    """(lock, registry URL): the pin and its dependencies, downloaded into the host cache. PackageError naming
    the package, the version and the registry when it cannot be."""
    try:
        return (_resolve_pip if manager == "pip" else _resolve_npm)(name, version)
    except subprocess.TimeoutExpired as err:
        raise PackageError(f"{manager} package {name}{'==' if manager == 'pip' else '@'}{version}: resolving it "
                           f"took over {err.timeout:g}s (`{' '.join(err.cmd[:3])} ...`): is the registry slow or "
                           "unreachable?") from None


# --------------------------------------------------------------------------------------------------------- pip
def requirements(lock: dict) -> str:
    """The lock's wheels to install (those not in the tools layer), as a `--require-hashes` requirements file."""
    return "".join(f"{a['name']}=={a['version']} --hash=sha256:{a['sha256']}\n"
                   for a in lock["artifacts"] if not a.get("in_tools_layer"))


def _tools_wheels() -> set[tuple[str, str, str]]:
    out = set()
    for line in lock_text().splitlines():
        m = re.match(r"^([A-Za-z0-9._-]+)==(\S+)\s+--hash=sha256:([0-9a-f]{64})", line)
        if m:
            out.add((_norm(m.group(1)), m.group(2), m.group(3)))
    return out


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pip_download(args: list[str], dest: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--retries", "1",
                           "--timeout", "30", *PLATFORM, *args, "-d", dest],
                          capture_output=True, text=True, timeout=TIMEOUT_S)


def requires_dist(wheel: Path) -> list[str]:
    """The wheel's `Requires-Dist` lines (its METADATA)."""
    with zipfile.ZipFile(wheel) as z:
        meta = [n for n in z.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
        text = z.read(meta[0]).decode(errors="replace") if meta else ""
    return [str(r) for r in HeaderParser().parsestr(text).get_all("Requires-Dist") or []]


def _no_direct_url(name: str, version: str, wheel: Path, indexes: list[str]) -> list[str]:
    """The wheel's requirements; PackageError naming the wheel and the requirement if one is a direct URL (PEP 508
    `NAME @ URL`, any scheme: http, file, git+...): pinned packages take every dependency from the index."""
    dist, ver = wheel.name.split("-")[:2]
    reqs = requires_dist(wheel)
    for req in reqs:
        if "@" in req.split(";")[0]:
            raise PackageError(f"pip package {name}=={version}: " + ("it" if _norm(dist) == _norm(name) else
                               f"its dependency {_norm(dist)}=={ver}") + f" requires {req.strip()!r}, a direct URL: "
                               f"pinned pip packages take every dependency from the index ({', '.join(indexes)}) only")
    return reqs


MAX_WHEELS = 200  # distributions in a pinned pip package's tree
MAX_NPM_SPECS = 2000  # distinct package ranges a pinned npm package's tree asks for
TARGET = {"python_version": "3.11", "python_full_version": "3.11.2", "implementation_name": "cpython",
          "platform_python_implementation": "CPython", "sys_platform": "linux", "platform_system": "Linux",
          "os_name": "posix", "platform_machine": "x86_64", "extra": ""}  # the image's Python, for markers


def _walk_pip(name: str, version: str, tmp: str) -> tuple[list[Path], list[str]]:
    """The pin's tree, resolved here rather than by pip: level by level, each requirement's best wheel from
    the index with `--no-deps` (what a resolver tries first), each wheel's METADATA read before its own
    requirements are fetched. pip's own resolution is never run: it follows a direct-URL requirement it
    meets while backtracking (a VCS one prepared with the repository's build backend, on the host), so a
    direct URL anywhere is refused before anything is fetched from it, and a tree whose first choices do
    not agree (a requirement another chosen version does not meet) is refused naming both, as is a tree of
    more than MAX_WHEELS distributions. Returns (wheels sorted by file name, index URLs)."""
    from packaging.requirements import InvalidRequirement, Requirement

    chosen: dict[str, tuple[str, Path]] = {}  # normalized name -> (version, wheel)
    wanted: list[tuple[str, Requirement]] = []  # (who asked, requirement): checked against the chosen versions
    level, depth = [f"{name}=={version}"], 0
    while level:
        dest = str(Path(tmp) / f"level-{depth}")
        res = _pip_download(["--no-deps", *level], dest)
        indexes = _indexes(res.stdout)
        if res.returncode != 0:
            raise PackageError(_pip_failure(name, version, indexes, res.stdout + res.stderr))
        level, depth, queued = [], depth + 1, set()
        for wheel in sorted(Path(dest).glob("*.whl")):
            dist, ver = wheel.name.split("-")[:2]
            chosen.setdefault(_norm(dist), (ver, wheel))
            if len(chosen) > MAX_WHEELS:
                raise PackageError(f"pip package {name}=={version}: its tree holds more than {MAX_WHEELS} "
                                   "distributions")
            for req in _no_direct_url(name, version, wheel, indexes):
                try:
                    r = Requirement(req)
                except InvalidRequirement as err:
                    raise PackageError(f"pip package {name}=={version}: {_norm(dist)}=={ver} requires {req!r}, "
                                       f"which does not parse: {err}") from None
                if r.marker is not None and not r.marker.evaluate(TARGET):
                    continue  # not for the image's Python (or an extra nobody asked for)
                wanted.append((f"{_norm(dist)}=={ver}", r))
                if _norm(r.name) not in chosen and _norm(r.name) not in queued:
                    queued.add(_norm(r.name))
                    level.append(f"{r.name}{r.specifier}")
    for who, r in wanted:
        got = chosen.get(_norm(r.name))
        if got is None or not r.specifier.contains(got[0], prereleases=True):
            raise PackageError(f"pip package {name}=={version}: {who} requires {str(r)!r}, but the tree's first "
                               f"choice is {_norm(r.name)}=={got[0] if got else '?'}: pinned pip packages are "
                               "resolved without backtracking (pin a release whose dependencies agree)")
    return sorted((w for _, w in chosen.values()), key=lambda w: w.name), indexes


def _resolve_pip(name: str, version: str) -> tuple[dict, str]:
    with tempfile.TemporaryDirectory(prefix="trajforge-pip-") as tmp:
        wheels, indexes = _walk_pip(name, version, tmp)
        layer = _tools_wheels()
        artifacts = []
        for p in wheels:
            dist, ver = p.name.split("-")[:2]
            sha = hashlib.sha256(p.read_bytes()).hexdigest()
            artifacts.append({"name": _norm(dist), "version": ver, "file": p.name, "sha256": sha,
                              "in_tools_layer": (_norm(dist), ver, sha) in layer})
        lock = {"manager": "pip", "name": _norm(name), "version": version, "artifacts": artifacts}
        req = requirements(lock)
        if req:
            _seed(wheelhouse_dir(req), {a["file"]: p for a, p in zip(artifacts, wheels) if not a["in_tools_layer"]},
                  {"requirements.txt": req})
    return lock, indexes[0]


def _indexes(stdout: str) -> list[str]:
    m = re.search(r"^Looking in indexes: (.+)$", stdout, re.M)
    return [u.strip() for u in m.group(1).split(",")] if m else ["https://pypi.org/simple"]


def _pip_failure(name: str, version: str, indexes: list[str], log: str) -> str:
    """Why `pip download NAME==VERSION` failed, said of the requirement pip names (the pin or a dependency),
    from what the index pages hold (pip itself says `from versions: none` for all of: an unreachable index, an
    unknown package, a package of sdists only)."""
    m = re.search(r"No matching distribution found for ([A-Za-z0-9._-]+)(?:\s*(?:==|===)\s*([^\s;,]+))?", log)
    if not m:
        return f"pip package {name}=={version}: pip download from {', '.join(indexes)} failed: {log.strip()[-800:]}"
    req, want = m.group(1), m.group(2)
    what = (f"pip package {name}=={version}" if _norm(req) == _norm(name)
            else f"pip package {name}=={version}: its dependency {req}{'==' + want if want else ''}")
    files, unreachable = [], []
    for index in indexes:
        if not index.startswith(("http://", "https://")):
            continue
        url = index.rstrip("/") + f"/{_norm(req)}/"
        try:
            with urllib.request.urlopen(url, timeout=30) as r:
                files += [f for f in re.findall(r"<a[^>]*>([^<]+)</a>", r.read().decode(errors="replace"))]
        except urllib.error.HTTPError as err:
            if err.code != 404:
                unreachable.append(f"{index} ({err.code} {err.reason})")
        except (urllib.error.URLError, OSError) as err:
            unreachable.append(f"{index} ({getattr(err, 'reason', err)})")
    where = ", ".join(indexes)
    if not files and unreachable:
        return f"{what}: the index is unreachable: {'; '.join(unreachable)}"
    if not files:
        return f"{what}: not found in the index {where} (no project {_norm(req)!r} there)"
    versions = sorted({pair[1] for f in files if (pair := _pair(f))})
    mine = [f for f in files if (pair := _pair(f)) and pair[0] == _norm(req) and (want is None or pair[1] == want)]
    if want and not mine:
        return f"{what}: version {want} not found in the index {where} (versions there: {', '.join(versions)})"
    if mine and not any(f.endswith(".whl") for f in mine):
        return (f"{what}: only a source distribution ({', '.join(mine)}) in {where}; pinned pip packages install "
                "wheels only (building an sdist runs its code)")
    return (f"{what}: no wheel for the image's Python (CPython 3.11, manylinux x86_64) in {where} "
            f"(files: {', '.join(mine or files)[:400]})")


def _pair(filename: str) -> tuple[str, str] | None:
    """(normalized project, version) of a wheel's or an sdist's file name."""
    m = re.match(r"^(.+?)-([0-9][A-Za-z0-9.+_!]*?)(?:-[^-]+-[^-]+-[^-]+\.whl|\.tar\.gz|\.zip)$", filename)
    return (_norm(m.group(1)), m.group(2)) if m else None


# --------------------------------------------------------------------------------------------------------- npm
def _npm(args: list[str], cwd: Path) -> dict | list:
    res = subprocess.run(["npm", *args, "--json", "--ignore-scripts", "--no-audit", "--no-fund"], cwd=cwd,
                         capture_output=True, text=True, timeout=TIMEOUT_S,
                         env={**os.environ, "npm_config_update_notifier": "false"})  # no check of npm's own version
    try:
        out = json.loads(res.stdout) if res.stdout.strip() else {}
    except ValueError:
        out = {}
    if res.returncode != 0:
        err = out.get("error", {}) if isinstance(out, dict) else {}
        raise _NpmFailed(err.get("code", f"exit {res.returncode}"), err.get("summary") or res.stderr.strip()[-600:])
    return out


class _NpmFailed(RuntimeError):
    def __init__(self, code: str, summary: str):
        super().__init__(f"{code}: {summary}")
        self.code, self.summary = code, summary


def npm_registry() -> str:
    try:
        res = subprocess.run(["npm", "config", "get", "registry"], capture_output=True, text=True, timeout=60,
                             env={**os.environ, "npm_config_update_notifier": "false"})
        return res.stdout.strip() or "https://registry.npmjs.org/"
    except (OSError, subprocess.TimeoutExpired):
        return "https://registry.npmjs.org/"


def _resolve_npm(name: str, version: str) -> tuple[dict, str]:
    if shutil.which("npm") is None:
        raise PackageError(f"npm package {name}@{version}: `npm` is not installed on this host (it resolves the pin)")
    registry = npm_registry()
    with tempfile.TemporaryDirectory(prefix="trajforge-npm-") as tmp:
        work = Path(tmp)
        (work / "package.json").write_text(json.dumps({"name": "trajforge-lock", "private": True,
                                                       "dependencies": {name: version}}))
        try:
            _walk_npm(name, version, registry, work)
            _npm(["install", "--package-lock-only", "--omit=dev"], work)
        except _NpmFailed as err:
            raise PackageError(_npm_failure(name, version, registry, err)) from None
        tree = json.loads((work / "package-lock.json").read_text())["packages"]
        _check_npm_tree(name, version, registry, tree)
        entries = [(path, e) for path, e in sorted(tree.items()) if path and not e.get("dev") and not e.get("link")]
        specs = [f"{e.get('name') or path.rsplit('node_modules/', 1)[-1]}@{e['version']}" for path, e in entries]
        (work / "out").mkdir()
        try:
            packed = _npm(["pack", "--pack-destination", str(work / "out"), *specs], work)
        except _NpmFailed as err:
            raise PackageError(_npm_failure(name, version, registry, err)) from None
        artifacts = []
        for (path, e), spec, p in zip(entries, specs, packed):
            data = (work / "out" / p["filename"]).read_bytes()
            integrity = p.get("integrity") or e.get("integrity")
            if e.get("integrity") and e["integrity"] != integrity:
                raise PackageError(f"npm package {name}@{version}: {spec} from {registry}: its tarball's integrity "
                                   f"{integrity} is not the registry's {e['integrity']}")
            try:
                npm_members(data)
            except UnsafeArchive as err:
                raise PackageError(f"npm package {name}@{version}: " + ("its tarball" if spec == f"{name}@{version}"
                                   else f"its dependency {spec}'s tarball") + f" {p['filename']} from {registry}: "
                                   f"{err}; pinned npm packages unpack regular files and directories only") from None
            artifacts.append({"name": spec.rsplit("@", 1)[0], "version": e["version"], "file": p["filename"],
                              "sha256": hashlib.sha256(data).hexdigest(), "integrity": integrity, "path": path,
                              "bin": e.get("bin") or {}, "install_script": bool(e.get("hasInstallScript"))})
        lock = {"manager": "npm", "name": name, "version": version, "artifacts": artifacts,
                "install_scripts": sorted(a["name"] for a in artifacts if a["install_script"])}
        try:
            check_npm_lock(lock)
        except UnsafeArchive as err:
            raise PackageError(f"npm package {name}@{version} from {registry}: {err}") from None
        _seed(npm_house_dir(lock), {a["file"]: work / "out" / a["file"] for a in artifacts}, {})
    return lock, registry


DEP_FIELDS = ("dependencies", "optionalDependencies", "peerDependencies")
REGISTRY_RANGE = re.compile(r"^[A-Za-z0-9 .*^~<>=|+_-]*$")  # versions, ranges, dist-tags: no `:`, `/`, `#`, `@`


def registry_spec(spec) -> tuple[str, str] | None:
    """(package, range) an npm dependency spec asks the registry for: a version, a range or a dist-tag, or an
    alias `npm:NAME@RANGE` of one (package NAME). None for anything else: a URL, `file:`, `link:`, `git`,
    `github:`, `user/repo`, `workspace:`, or an alias of one of those (npm would fetch or read it elsewhere)."""
    if not isinstance(spec, str):
        return None
    if spec.startswith("npm:"):
        target = spec[4:]
        at = target.find("@", 1)
        name, rng = (target, "*") if at < 0 else (target[:at], target[at + 1:])
        return (name, rng) if NPM_NAME.match(name) and REGISTRY_RANGE.match(rng) else None
    return ("", spec) if REGISTRY_RANGE.match(spec) else None


def _refuse_spec(name: str, version: str, registry: str, who: str, dep: str, spec) -> PackageError:
    return PackageError(f"npm package {name}@{version}: " + ("it" if who == f"{name}@{version}" else
                        f"its dependency {who}") + f" depends on {dep}: {spec!r}, not a version or range of the "
                        f"registry {registry}: pinned npm packages take every dependency from the registry only "
                        "(no URL, file:, link:, git or github: specs)")


def _semver_key(v: str) -> tuple:
    m = re.match(r"^(\d+)\.(\d+)\.(\d+)(?:-([^+]*))?", v or "")
    if not m:
        return (-1,)
    pre = m.group(4)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3)), pre is None,
            tuple((0, int(x), "") if x.isdigit() else (1, 0, x) for x in (pre or "").split(".")))


def _walk_npm(name: str, version: str, registry: str, work: Path) -> None:
    """Before npm resolves the pin, walk its tree through the registry's manifests (`npm view NAME@RANGE`):
    every version a dependency's range admits must itself ask only for registry versions or ranges
    (`registry_spec`), or the pin is refused naming the package and the spec, before npm would fetch a URL or
    read a host path. The walk follows the version npm picks (the `latest` tag if in range, else the highest);
    the lock npm then writes is checked again (`_check_npm_tree`)."""
    from concurrent.futures import ThreadPoolExecutor

    seen, level = set(), [(name, version)]
    with ThreadPoolExecutor(4) as pool:
        while level:
            level = [k for k in dict.fromkeys(level) if k not in seen]
            seen.update(level)
            if len(seen) > MAX_NPM_SPECS:
                raise PackageError(f"npm package {name}@{version}: its tree asks for more than {MAX_NPM_SPECS} "
                                   f"package ranges from {registry}")
            found = list(pool.map(lambda k: _npm_view(f"{k[0]}@{k[1]}", work), level))
            nxt = []
            for (pkg, rng), out in zip(level, found):
                manifests = [m for m in (out if isinstance(out, list) else [out]) if isinstance(m, dict) and m]
                for m in manifests:
                    for field in DEP_FIELDS:
                        for dep, spec in (m.get(field) or {}).items():
                            if registry_spec(spec) is None:
                                raise _refuse_spec(name, version, registry, f"{pkg}@{m.get('version')}", dep, spec)
                if not manifests:
                    continue  # nothing in range: npm install says so, named
                latest = (manifests[0].get("dist-tags") or {}).get("latest")
                chosen = next((m for m in manifests if m.get("version") == latest), None) or max(
                    manifests, key=lambda m: _semver_key(m.get("version")))
                optional_peers = {k for k, v in (chosen.get("peerDependenciesMeta") or {}).items()
                                  if isinstance(v, dict) and v.get("optional")}
                for field in DEP_FIELDS:
                    for dep, spec in (chosen.get(field) or {}).items():
                        if field == "peerDependencies" and dep in optional_peers:
                            continue
                        real, want = registry_spec(spec)
                        nxt.append((real or dep, want or "*"))
            level = nxt


def _npm_view(spec: str, work: Path) -> dict | list:
    try:
        return _npm(["view", spec], work)
    except _NpmFailed as err:
        if err.code == "E404":  # no such package or version: `npm install` says which, named
            return {}
        raise


def _check_npm_tree(name: str, version: str, registry: str, tree: dict) -> None:
    """The lock npm wrote: every package resolved from a tarball under the registry, none a link to a folder,
    every dependency spec a registry one (what the walk could not foresee is refused here, named)."""
    base = registry.rstrip("/") + "/"
    for path, e in sorted(tree.items()):
        if not path:
            continue
        who = f"{e.get('name') or path.rsplit('node_modules/', 1)[-1]}@{e.get('version')}"
        if e.get("link") or not str(e.get("resolved", "")).startswith(base):
            raise PackageError(f"npm package {name}@{version}: {who} at {path} resolves to "
                               f"{e.get('resolved')!r}, not a tarball of the registry {registry}: pinned npm "
                               "packages take every dependency from the registry only")
        for field in DEP_FIELDS:
            for dep, spec in (e.get(field) or {}).items():
                if registry_spec(spec) is None:
                    raise _refuse_spec(name, version, registry, who, dep, spec)


def _npm_failure(name: str, version: str, registry: str, err: _NpmFailed) -> str:
    what = f"npm package {name}@{version}"
    if err.code == "E404":
        return f"{what}: not found in the registry {registry} ({err.summary})"
    if err.code == "ETARGET":
        return f"{what}: version not found in the registry {registry} ({err.summary})"
    if err.code in ("ECONNREFUSED", "ENOTFOUND", "ETIMEDOUT", "EAI_AGAIN", "ECONNRESET") or "FetchError" in err.summary:
        return f"{what}: the registry {registry} is unreachable ({err.code}: {err.summary})"
    return f"{what}: npm could not resolve it from {registry} ({err.code}: {err.summary})"


# ------------------------------------------------------------------------------------------ npm tarball safety
# An npm tarball is unpacked by path into PKG_DIR/node_modules: a symlink in it (`package/node_modules/x -> /usr/bin`)
# would let a nested package's files land anywhere in the image at build (as root). Only regular files and
# directories, below the tarball's top folder, with no absolute path and no `..`, are taken; anything else refuses
# the artifact, at import (PackageError) and again at build (UnsafeArtifact), from the hash-checked bytes.
NPM_PATH = re.compile(r"^node_modules/(@[a-z0-9][a-z0-9._~-]*/)?[a-z0-9][a-z0-9._~-]*"
                      r"(/node_modules/(@[a-z0-9][a-z0-9._~-]*/)?[a-z0-9][a-z0-9._~-]*)*$")
ARTIFACT_FILE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+!-]*\.(whl|tgz)$")


class UnsafeArchive(ValueError):
    """An npm tarball with a member that is not a regular file or a directory, or whose path escapes."""


def _kind(m: tarfile.TarInfo) -> str:
    if m.issym():
        return f"a symlink to {m.linkname}"
    if m.islnk():
        return f"a hard link to {m.linkname}"
    if m.ischr() or m.isblk():
        return "a device"
    if m.isfifo():
        return "a fifo"
    return f"a member of tar type {m.type!r}"


def npm_members(data: bytes) -> list[tuple[str, tarfile.TarInfo, bytes | None]]:
    """[(path below the tarball's top folder, member, bytes or None for a folder)]: what unpacking the tarball
    (`--strip-components=1`) makes. UnsafeArchive naming the member for anything but regular files and
    directories (symlinks, hard links, devices, fifos), an absolute path or a `..` component."""
    out = []
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
            for m in tar:
                parts = m.name.replace("\\", "/").split("/")
                if m.name.startswith("/") or "\\" in m.name:
                    raise UnsafeArchive(f"member {m.name!r} has an absolute or backslashed path")
                if ".." in parts:
                    raise UnsafeArchive(f"member {m.name!r} has a `..` component")
                if not (m.isreg() or m.isdir()):
                    raise UnsafeArchive(f"member {m.name!r} is {_kind(m)} (only regular files and directories)")
                rel = "/".join(p for p in parts[1:] if p not in ("", "."))
                if rel:
                    out.append((rel, m, tar.extractfile(m).read() if m.isreg() else None))
    except (tarfile.TarError, OSError, EOFError) as err:
        raise UnsafeArchive(f"not a readable tarball ({err})") from None
    seen: dict[str, bool] = {}
    for rel, _, body in out:  # a path that is a file in one member and a folder (or a file's parent) in another
        for i, part in enumerate(rel.split("/")):
            prefix = "/".join(rel.split("/")[:i + 1])
            is_dir = body is None or i < rel.count("/")
            if seen.setdefault(prefix, is_dir) != is_dir:
                raise UnsafeArchive(f"member {prefix!r} is both a file and a folder")
    return out


def unpack_npm(data: bytes, dest: Path) -> None:
    """Unpack an npm tarball into `dest` (a fresh folder) as a plain tree: regular files (0644, 0755 if
    executable) and folders only, nothing followed or linked (`npm_members` refuses anything else)."""
    for rel, m, body in npm_members(data):
        target = dest / rel
        if body is None:
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(body)
        os.chmod(target, 0o755 if m.mode & 0o111 else 0o644)


def check_npm_lock(lock: dict) -> None:
    """UnsafeArchive unless every artifact's `path` is below node_modules/ (package names only: no `..`, not
    absolute), its `file` a plain file name, and the pinned package's bins point inside it."""
    for a in lock["artifacts"]:
        if not isinstance(a.get("path"), str) or not NPM_PATH.match(a["path"]):
            raise UnsafeArchive(f"{a.get('name')}@{a.get('version')}: lock path {a.get('path')!r} is not "
                                "node_modules/<name>[/node_modules/<name>...]")
        if not isinstance(a.get("file"), str) or not ARTIFACT_FILE.match(a["file"]):
            raise UnsafeArchive(f"{a.get('name')}@{a.get('version')}: file {a.get('file')!r} is not a plain file name")
        for name, target in (a.get("bin") or {}).items():
            norm = posixpath.normpath(posixpath.join(a["path"], str(target)))
            if not norm.startswith(a["path"] + "/") or not re.match(r"^[A-Za-z0-9@._+-]+$", str(name)):
                raise UnsafeArchive(f"{a['name']}@{a['version']}: bin {name!r} -> {target!r} is outside the package")


# ------------------------------------------------------------------------------------------------- host cache
def npm_house_dir(lock: dict) -> Path:
    digest = hashlib.sha256(json.dumps(lock["artifacts"], sort_keys=True).encode()).hexdigest()[:16]
    return cache_root() / "npm" / digest


def _seed(root: Path, files: dict[str, Path], texts: dict[str, str]) -> None:
    """Fill the cache folder `root` (written under a temporary name, then renamed; kept if present)."""
    if (root / ".complete").exists():
        return
    part = root.with_name(root.name + f".part-{os.getpid()}")
    shutil.rmtree(part, ignore_errors=True)
    part.mkdir(parents=True)
    for name, src in files.items():
        shutil.copyfile(src, part / name)
    for name, text in texts.items():
        (part / name).write_text(text)
    (part / ".complete").write_text("")
    shutil.rmtree(root, ignore_errors=True)
    try:
        part.rename(root)
    except OSError:
        shutil.rmtree(part, ignore_errors=True)


def artifacts(lock: dict) -> list[tuple[str, Path]]:
    """[(file name, host path)] of the lock's artifacts to install, from the host cache (downloaded again from
    the registry if absent), every one checked against the lock's sha256: ArtifactMismatch naming the artifact
    otherwise, ToolsLayerError if it cannot be fetched."""
    what = f"pinned {lock['manager']} package {lock['name']}{'==' if lock['manager'] == 'pip' else '@'}{lock['version']}"
    try:
        if lock["manager"] == "npm":
            check_npm_lock(lock)
        for a in lock["artifacts"]:
            if not isinstance(a.get("file"), str) or not ARTIFACT_FILE.match(a["file"]):
                raise UnsafeArchive(f"{a.get('name')}=={a.get('version')}: file {a.get('file')!r} is not a plain "
                                    "file name")
    except UnsafeArchive as err:
        raise UnsafeArtifact(f"{what}: its lock is unsafe: {err}") from None
    if lock["manager"] == "pip":
        req = requirements(lock)
        if not req:
            return []
        house = wheelhouse(req, what)  # pip checks every hash against the lock (--require-hashes)
        wanted = [a for a in lock["artifacts"] if not a.get("in_tools_layer")]
    else:
        house = npm_house_dir(lock)
        wanted = lock["artifacts"]
        if not (house / ".complete").exists():
            _fetch_npm(lock, house, what)
    out = []
    for a in wanted:
        path = house / a["file"]
        if not path.is_file():
            raise ToolsLayerError(f"{what}: {a['file']} is missing from the host cache {house} (delete the folder to "
                                  "download the lock again)")
        got = hashlib.sha256(path.read_bytes()).hexdigest()
        if got != a["sha256"]:
            raise ArtifactMismatch(f"{what}: artifact {a['file']} ({a['name']} {a['version']}) has sha256 {got}, the "
                                   f"lock has {a['sha256']}: the registry serves other bytes than were locked (a "
                                   "republished version); import the folder again to lock the new bytes")
        out.append((a["file"], path))
    return out


def _fetch_npm(lock: dict, house: Path, what: str) -> None:
    with tempfile.TemporaryDirectory(prefix="trajforge-npm-") as tmp:
        out = Path(tmp) / "out"
        out.mkdir()
        try:
            packed = _npm(["pack", "--pack-destination", str(out),
                           *[f"{a['name']}@{a['version']}" for a in lock["artifacts"]]], Path(tmp))
        except _NpmFailed as err:
            if err.code == "EINTEGRITY":
                raise ArtifactMismatch(f"{what}: the registry's tarball does not match its integrity ({err.summary})") from None
            raise ToolsLayerError(f"{what}: could not download the locked tarballs from {npm_registry()}: {err}") from None
        for a, p in zip(lock["artifacts"], packed):
            data = (out / p["filename"]).read_bytes()
            got = hashlib.sha256(data).hexdigest()
            if got != a["sha256"]:
                raise ArtifactMismatch(f"{what}: artifact {a['file']} ({a['name']} {a['version']}) downloaded from "
                                       f"{npm_registry()} has sha256 {got}, the lock has {a['sha256']}: the registry "
                                       "serves other bytes than were locked (a republished version); import the "
                                       "folder again to lock the new bytes")
            if p["filename"] != a["file"]:
                (out / p["filename"]).rename(out / a["file"])
        _seed(house, {a["file"]: out / a["file"] for a in lock["artifacts"]}, {})

