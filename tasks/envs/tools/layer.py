"""The tools layer: the base image plus the MCP Python SDK, which every `tools` environment image builds on.

The SDK (`mcp` and its dependency closure) is pinned, version and sha256 of every wheel, in
`deploy/images/tools/requirements.txt`. The wheels are downloaded on the host, from the registry the
project installs from (`pip download --require-hashes`, cached under `$TRAJFORGE_CACHE/wheels/<lock
hash>`), and copied into a build with no network, where pip (run from its own pinned wheel: the base
image has no pip) installs them `--no-index --require-hashes --no-deps` into `SDK_DIR`, a root-owned
folder outside Debian's Python (PEP 668) that the tool server puts on its own `sys.path`.

Invariants: the layer's tag is `trajforge/tools:<hash of the base image id, the lock and the recipe>`,
so a new lock or base gives a new layer and, through `image_tag` (it hashes the layer's id as the
base), new environment images; same inputs, same tag, built once per engine. Nothing is fetched at
build time inside Docker, and a wheel whose hash differs from the lock's fails the download.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import docker

from ...engine.cache import cache_root

LOCK = Path(__file__).resolve().parents[3] / "deploy" / "images" / "tools" / "requirements.txt"
SDK_DIR = "/opt/trajforge/mcp"  # the server does `sys.path.insert(0, SDK_DIR)` (server.py)
REPO = "trajforge/tools"
PLATFORM = ["--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311",
            "--abi", "abi3", "--abi", "none", "--platform", "manylinux_2_17_x86_64",
            "--platform", "manylinux2014_x86_64"]  # bookworm's python3 (3.11, glibc 2.36)
RECIPE = """FROM {base}
COPY wheels/ /tmp/trajforge-wheels/
RUN python3 /tmp/trajforge-wheels/{pip} install --no-index --find-links /tmp/trajforge-wheels --require-hashes \\
      --no-deps --no-compile --no-cache-dir --disable-pip-version-check --root-user-action=ignore \\
      --target {sdk} -r /tmp/trajforge-wheels/requirements.txt \\
 && rm -rf /tmp/trajforge-wheels && chmod -R a+rX,go-w {sdk}
"""
# a brought Node server (`mcp-server` folders with `runtime: node`): Debian's Node.js, pinned, on the tools layer;
# apt reaches Debian's mirror on the host network (a pinned version the mirror no longer has fails the build)
NODE_VERSION = "18.20.4+dfsg-1~deb12u2"
NODE_RECIPE = """FROM {base}
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \\
      nodejs={version} >/dev/null && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb && node --version
"""
_LOCK = threading.Lock()


class ToolsLayerError(RuntimeError):
    """The tools layer could not be made (wheels not downloadable, build failed)."""

    cause = "build_fetch_failed"


class ArtifactMismatch(ToolsLayerError):
    """A locked artifact (a wheel, an npm tarball) whose bytes are not the lock's: the message names it."""

    cause = "artifact_mismatch"


class UnsafeArtifact(ToolsLayerError):
    """A locked npm tarball holding anything but regular files and folders (a symlink, a hard link, a device),
    an absolute or `..` path, or a lock whose paths leave node_modules/: the message names it."""

    cause = "artifact_unsafe"


def lock_text() -> str:
    return LOCK.read_text()


def wheelhouse_dir(lock: str) -> Path:
    return cache_root() / "wheels" / hashlib.sha256(lock.encode()).hexdigest()[:16]


def wheelhouse(lock: str | None = None, what: str = "the MCP SDK's wheels") -> Path:
    """The folder holding exactly the lock's wheels (downloaded once per lock, hash-checked by pip: a wheel
    whose bytes differ is `ArtifactMismatch`, naming it). `what`: the lock, for messages."""
    lock = lock_text() if lock is None else lock
    root = wheelhouse_dir(lock)
    digest = root.name
    if (root / ".complete").exists():
        return root
    part = root.with_name(digest + f".part-{os.getpid()}")
    part.mkdir(parents=True, exist_ok=True)
    (part / "requirements.txt").write_text(lock)
    res = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--require-hashes",
                          *PLATFORM, "-r", str(part / "requirements.txt"), "-d", str(part)],
                         capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        subprocess.run(["rm", "-rf", str(part)], check=False)
        bad = re.findall(r"^\s*(\S+) from (\S+?):?(?: \(from [^\n]*)?\n\s*Expected sha256 (\S+)\s*\n\s*Got\s+(\S+)", res.stderr, re.M)
        if "DO NOT MATCH THE HASHES" in res.stderr and bad:
            raise ArtifactMismatch(f"{what}: " + "; ".join(
                f"artifact {url.rsplit('/', 1)[-1].split('#')[0]} ({req}) from {url.split('#')[0]} has sha256 {got}, "
                f"the lock has {want}" for req, url, want, got in bad)
                + ": the index serves other bytes than were locked (a republished version)")
        raise ToolsLayerError(f"could not download {what}: {res.stderr[-1500:]}")
    (part / ".complete").write_text("")
    try:
        part.rename(root)
    except OSError:  # another process finished first: use its copy
        subprocess.run(["rm", "-rf", str(part)], check=False)
    return root


def pip_wheel(lock: str) -> str:
    """The file name of the pip wheel the tools lock pins (the installer of every layer's wheels)."""
    pip = next((line.split("==")[1].split()[0] for line in lock.splitlines() if line.startswith("pip==")), None)
    if pip is None:
        raise ToolsLayerError(f"{LOCK} pins no pip (the installer)")
    return f"pip-{pip}-py3-none-any.whl"


def recipe(base_id: str, lock: str) -> str:
    return RECIPE.format(base=base_id, pip=f"{pip_wheel(lock)}/pip", sdk=SDK_DIR)


def layer_tag(base_id: str, lock: str | None = None) -> str:
    lock = lock_text() if lock is None else lock
    text = recipe(base_id, lock)
    return f"{REPO}:" + hashlib.sha256(f"{base_id}\n{lock}\n{text}".encode()).hexdigest()[:16]


def runtime_of(env) -> str:
    """`python` or `node`: what a brought server runs on (`.tools/server.json`), `python` for the built-in one."""
    text = next((f.content for f in env.files if f.path.strip("/") == ".tools/server.json"), None) if env else None
    return json.loads(text).get("runtime", "python") if text else "python"


def ensure_tools_layer(client: docker.DockerClient, base_id: str, env=None, network: bool = True) -> str:
    """The id of the tools layer over `base_id` on `client`'s engine (built now if absent); for an
    environment whose brought server runs on Node.js, the Node layer over it (built only where builds may
    use the network: `network`, i.e. `synthesize.build.egress` not `none`); for a server pinned as a package
    (`.tools/package.lock.json`), the package layer over that (`PACKAGE_RECIPES`: no network)."""
    layer_id = _python_layer(client, base_id)
    if runtime_of(env) == "node":
        layer_id = _node_layer(client, layer_id, network)
    from .package import lock_of

    lock = lock_of(env.files) if env else None
    return _package_layer(client, layer_id, lock) if lock else layer_id


def _node_layer(client: docker.DockerClient, layer_id: str, network: bool) -> str:
    if not network:
        raise ToolsLayerError("a Node.js server's layer installs Debian's nodejs: it needs the build network "
                              "(synthesize.build.egress: allowlist or host)")
    text = NODE_RECIPE.format(base=layer_id, version=NODE_VERSION)
    tag = f"{REPO}-node:" + hashlib.sha256(text.encode()).hexdigest()[:16]
    with _LOCK:
        return _build(client, tag, text, [], network=True)


def _build(client: docker.DockerClient, tag: str, dockerfile: str, files: list[tuple[str, Path]],
           network: bool = False) -> str:
    try:
        return client.images.get(tag).id
    except docker.errors.ImageNotFound:
        pass
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = dockerfile.encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        for arcname, path in files:
            tar.add(str(path), arcname=arcname)
    buf.seek(0)
    try:
        image, _ = client.images.build(fileobj=buf, custom_context=True, tag=tag, rm=True, forcerm=True,
                                       network_mode="host" if network else "none",
                                       labels={"trajforge.image": "tools-layer"})
    except (docker.errors.BuildError, docker.errors.APIError) as err:
        log = "".join(str(c.get("stream", c.get("error", ""))) for c in getattr(err, "build_log", []) or [])
        raise ToolsLayerError(f"the tools layer {tag} failed to build: {err}\n{log[-1500:]}") from None
    return image.id


def _python_layer(client: docker.DockerClient, base_id: str) -> str:
    lock = lock_text()
    tag = layer_tag(base_id, lock)
    with _LOCK:
        try:
            return client.images.get(tag).id
        except docker.errors.ImageNotFound:
            pass
        house = wheelhouse(lock)
        files = [(f"wheels/{f.name}", f) for f in sorted(house.iterdir())
                 if f.suffix == ".whl" or f.name == "requirements.txt"]
        return _build(client, tag, recipe(base_id, lock), files)


# a brought server pinned as a package (tasks/envs/tools/package.py): its locked artifacts, from the host cache,
# installed with no network into PKG_DIR (pip: wheels only, hash-checked, no dependency resolution; npm: tarballs
# unpacked ON THE HOST from their hash-checked bytes, each into a fresh folder, regular files and folders only (a
# symlink, hard link, device, absolute or `..` member refuses the artifact: `UnsafeArtifact`), and the plain tree
# copied to the lock's paths; no install script run; the bins in PKG_DIR/bin)
PACKAGE_RECIPES = {"pip": """FROM {base}
COPY pkg/ /tmp/trajforge-pkg/
RUN python3 /tmp/trajforge-pkg/{pip}/pip install --no-index --find-links /tmp/trajforge-pkg --require-hashes \\
      --no-deps --no-compile --no-cache-dir --disable-pip-version-check --root-user-action=ignore \\
      --target {pkg}/site -r /tmp/trajforge-pkg/requirements.txt \\
 && mkdir -p {pkg}/bin && if [ -d {pkg}/site/bin ]; then mv {pkg}/site/bin/* {pkg}/bin/ && rmdir {pkg}/site/bin; fi \\
 && rm -rf /tmp/trajforge-pkg && chmod -R a+rX,go-w {pkg}
""", "npm": """FROM {base}
COPY pkg/node_modules/ {pkg}/node_modules/
COPY pkg/bins.txt /tmp/trajforge-pkg/bins.txt
RUN set -e; mkdir -p {pkg}/bin; \\
    while read -r name target; do chmod a+x "{pkg}/$target" && ln -s "{pkg}/$target" "{pkg}/bin/$name"; \\
      done < /tmp/trajforge-pkg/bins.txt; \\
    rm -rf /tmp/trajforge-pkg; chmod -R a+rX,go-w {pkg}
"""}


def _package_layer(client: docker.DockerClient, layer_id: str, lock: dict) -> str:
    """The layer over `layer_id` with the package `lock` pins installed (built once per layer and lock)."""
    import posixpath
    import tempfile

    from .package import PKG_DIR, UnsafeArchive, artifacts, requirements, unpack_npm

    manager = lock["manager"]
    tools = lock_text()
    text = PACKAGE_RECIPES[manager].format(base=layer_id, pip=pip_wheel(tools), pkg=PKG_DIR)
    tag = f"{REPO}-pkg:" + hashlib.sha256(f"{layer_id}\n{json.dumps(lock, sort_keys=True)}\n{text}".encode()).hexdigest()[:16]
    with _LOCK:
        try:
            return client.images.get(tag).id
        except docker.errors.ImageNotFound:
            pass
        files = [(f"pkg/{name}", path) for name, path in artifacts(lock)]
        with tempfile.TemporaryDirectory(prefix="trajforge-pkg-") as tmp:
            lists = {}
            if manager == "pip":
                files.append((f"pkg/{pip_wheel(tools)}", wheelhouse() / pip_wheel(tools)))
                lists["requirements.txt"] = requirements(lock)
            else:
                tree = Path(tmp) / "tree"
                for (name, path), a in zip(files, lock["artifacts"]):
                    fresh = Path(tmp) / "unpack" / name  # one fresh folder per artifact, then merged as plain files
                    try:
                        unpack_npm(path.read_bytes(), fresh)
                    except UnsafeArchive as err:
                        raise UnsafeArtifact(f"pinned npm package {lock['name']}@{lock['version']}: artifact "
                                             f"{a['file']} ({a['name']}@{a['version']}): {err}; pinned npm packages "
                                             "unpack regular files and directories only") from None
                    _merge(fresh, tree / a["path"])
                files = [("pkg/node_modules", tree / "node_modules")]
                top = next(a for a in lock["artifacts"] if a["path"] == f"node_modules/{lock['name']}")
                lists["bins.txt"] = "".join(
                    f"{name} {posixpath.normpath(posixpath.join(top['path'], target))}\n"
                    for name, target in sorted(top["bin"].items()) if "/" not in name)
            for name, content in lists.items():
                (Path(tmp) / name).write_text(content)
                files.append((f"pkg/{name}", Path(tmp) / name))
            return _build(client, tag, text, files)


def _merge(src: Path, dest: Path) -> None:
    """Copy the plain tree `src` (regular files and folders, made by `unpack_npm`) into `dest`, following nothing."""
    dest.mkdir(parents=True, exist_ok=True)
    for p in sorted(src.iterdir()):
        if p.is_symlink() or not (p.is_dir() or p.is_file()):
            raise UnsafeArtifact(f"{p} is not a plain file or folder")
        if p.is_dir():
            if (dest / p.name).is_symlink() or (dest / p.name).is_file():
                raise UnsafeArtifact(f"{dest / p.name} is both a file and a folder")
            _merge(p, dest / p.name)
        else:
            if (dest / p.name).is_symlink() or (dest / p.name).is_dir():
                raise UnsafeArtifact(f"{dest / p.name} is both a file and a folder")
            (dest / p.name).write_bytes(p.read_bytes())
            (dest / p.name).chmod(p.stat().st_mode & 0o755)
