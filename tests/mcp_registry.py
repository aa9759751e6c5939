"""A package registry on loopback for the tests of pinned MCP servers (tests/test_tool_byo_package.py): a PEP 503
simple index for pip and a minimal npm registry, both over http on 127.0.0.1, serving artifacts the tests build
from tests/mcp_packages/ (a wheel built with the standard library, an `npm pack` tarball). Nothing leaves the host.

`Registry.add(path)` publishes an artifact (a wheel under its project, an npm tarball under its package.json
name); `Registry.replace(name, data)` serves other bytes under the same file name (a republished artifact);
`Registry.tarball_urls[(name, version)]` points an npm version's `dist.tarball` elsewhere.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import re
import subprocess
import tarfile
import threading
import tomllib
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

EPOCH = (1980, 1, 1, 0, 0, 0)


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def build_wheel(project: Path, dest: Path) -> Path:
    """A pure-Python wheel of `project` (its pyproject.toml's name, version, dependencies and scripts; every
    module below it),
    byte-for-byte the same on every run (fixed timestamps, sorted entries)."""
    meta = tomllib.loads((project / "pyproject.toml").read_text())["project"]
    dist = f"{re.sub(r'[-_.]+', '_', meta['name'])}-{meta['version']}"
    files: dict[str, bytes] = {}
    for p in sorted(project.rglob("*.py")):
        files[p.relative_to(project).as_posix()] = p.read_bytes()
    info = f"{dist}.dist-info"
    files[f"{info}/METADATA"] = (f"Metadata-Version: 2.1\nName: {meta['name']}\nVersion: {meta['version']}\n"
                                 f"Summary: {meta.get('description', '')}\n"
                                 + "".join(f"Requires-Dist: {d}\n" for d in meta.get("dependencies", []))).encode()
    files[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: trajforge-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    if meta.get("scripts"):
        files[f"{info}/entry_points.txt"] = ("[console_scripts]\n" + "".join(
            f"{k} = {v}\n" for k, v in sorted(meta["scripts"].items()))).encode()
    record = "".join(f"{k},sha256={base64.urlsafe_b64encode(hashlib.sha256(v).digest()).rstrip(b'=').decode()},{len(v)}\n"
                     for k, v in files.items()) + f"{info}/RECORD,,\n"
    files[f"{info}/RECORD"] = record.encode()
    dest.mkdir(parents=True, exist_ok=True)
    out = dest / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(zipfile.ZipInfo(name, EPOCH), data)
    return out


def npm_pack(project: Path, dest: Path) -> Path:
    """`npm pack` of `project` into `dest` (offline: a local folder)."""
    dest.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(["npm", "pack", "--json", "--pack-destination", str(dest), str(project.resolve())],
                         capture_output=True, text=True, check=True, timeout=120)
    return dest / json.loads(res.stdout)[0]["filename"]


def sdist(name: str, version: str, dest: Path) -> Path:
    """A source distribution only (no wheel): what pinned pip packages refuse."""
    dest.mkdir(parents=True, exist_ok=True)
    out = dest / f"{name.replace('-', '_')}-{version}.tar.gz"
    with tarfile.open(out, "w:gz") as tar:
        data = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
        info = tarfile.TarInfo(f"{name.replace('-', '_')}-{version}/PKG-INFO")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return out


class Registry:
    """Loopback http: `/simple/<project>/` (PEP 503, with #sha256 fragments), `/<npm name>` (a packument:
    versions -> dist.tarball, dist.integrity, dist.shasum) and `/files/<file>` (the artifacts)."""

    def __init__(self):
        self.files: dict[str, bytes] = {}
        self.pip: dict[str, list[str]] = {}  # normalized project -> file names
        self.npm: dict[str, dict[str, dict]] = {}  # package -> version -> its package.json
        self.npm_files: dict[tuple[str, str], str] = {}
        self.requests: list[str] = []
        self.tarball_urls: dict[tuple[str, str], str] = {}  # (npm name, version) -> a dist.tarball elsewhere
        registry = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                registry.requests.append(self.path)
                status, body, kind = registry.answer(self.path.split("?")[0])
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")  # a republished artifact is seen at once
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def index_url(self) -> str:
        return f"{self.url}/simple"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def add(self, path: Path) -> None:
        data = path.read_bytes()
        self.files[path.name] = data
        if path.name.endswith((".whl", ".tar.gz")) and not path.name.endswith(".tgz"):
            names = self.pip.setdefault(normalize(path.name.split("-")[0]), [])
            names += [] if path.name in names else [path.name]
        if path.name.endswith(".tgz"):
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                manifest = json.load(tar.extractfile("package/package.json"))
            self.npm.setdefault(manifest["name"], {})[manifest["version"]] = manifest
            self.npm_files[(manifest["name"], manifest["version"])] = path.name

    def replace(self, name: str, data: bytes) -> None:
        self.files[name] = data

    def answer(self, path: str) -> tuple[int, bytes, str]:
        if path.startswith("/files/") and path[7:] in self.files:
            return 200, self.files[path[7:]], "application/octet-stream"
        m = re.fullmatch(r"/simple/([^/]+)/?", path)
        if m:
            names = self.pip.get(normalize(m.group(1)))
            if not names:
                return 404, b"not found", "text/plain"
            links = "".join(f'<a href="{self.url}/files/{n}#sha256={hashlib.sha256(self.files[n]).hexdigest()}">'
                            f"{n}</a><br/>\n" for n in names)
            return 200, f"<!DOCTYPE html><html><body>\n{links}</body></html>\n".encode(), "text/html"
        name = path.lstrip("/").replace("%2f", "/").replace("%2F", "/")
        if name in self.npm:
            versions = {}
            for version, manifest in self.npm[name].items():
                data = self.files[self.npm_files[(name, version)]]
                versions[version] = {**manifest, "dist": {
                    "tarball": self.tarball_urls.get((name, version), f"{self.url}/files/{self.npm_files[(name, version)]}"),
                    "shasum": hashlib.sha1(data).hexdigest(),
                    "integrity": "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()}}
            latest = sorted(versions)[-1]
            body = {"name": name, "dist-tags": {"latest": latest}, "versions": versions}
            return 200, json.dumps(body).encode(), "application/json"
        return 404, json.dumps({"error": "Not found"}).encode(), "application/json"
