"""A loopback Hugging Face Hub for tests: the part of the Hub HTTP API that the real
`huggingface_hub` client (2.x) and `datasets.load_dataset("<org>/<name>", revision=...)` use to
publish and read a dataset repository.

Speaks: repo create (seeded with the Hub's `.gitattributes`, which sends `*.parquet` to LFS), card
(YAML) validation, preupload (`uploadMode` "lfs" for a path the revision's `.gitattributes` marks
`filter=lfs` or a file of at least `lfs_threshold` bytes, else "regular"), the LFS batch API
(`/<repo>.git/info/lfs/objects/batch`: basic transfer = PUT to the upload href, then POST to the
verify href; multipart = PUT each part to its href, then POST the parts' etags to the upload href,
for objects of at least `multipart_threshold` bytes; an object storage already holds gets no
`actions`, which is how the client skips re-sending it), the NDJSON commit (`file` and `lfsFile`
lines: an `lfsFile` must name an object storage holds, with its size), repo/revision info, tree and
paths-info (LFS files carry `lfs` {oid, size, pointerSize}), refs, commits, branch and tag
create/delete, and file resolve (HEAD/GET with Range; LFS files serve their content with
`X-Linked-Etag` / `X-Linked-Size`). No Xet: the server advertises none and answers the Xet token
route with 501, so a client with `hf_xet` installed must be told `HF_HUB_DISABLE_XET=1` (huggingface_hub
2.x picks Xet on the client side whenever `hf_xet` is importable). Repositories live on disk with
real commits: content-addressed blobs (git blob ids; an LFS file's blob is its pointer), LFS objects
by sha256 (`lfs/<sha256>`, written whole or not at all), one immutable JSON commit per write with its
parent and its whole tree, and refs (branches, tags) replaced atomically.

Invariants: a commit applies all of its operations or none (the body is read and checked in full
before anything is written; a `parentCommit` that is not the branch head is refused with 412);
tags are immutable (409 when they exist). Faults for tests: `fail(route, after=N)` answers the
(N+1)-th request to `route` with a 400; `stall(route)` holds requests to `route` until `release()`
(routes: `preupload`, `lfs-batch`, `lfs-upload` (a PUT of an object or a part), `lfs-verify`, `commit`
and `tag` before they act, `commit-applied` and `tag-applied` once the new ref is written, before the
answer); `wait_idle()` waits until no request is being served. `lfs_puts` lists the sha256 of every
object PUT (whole objects and parts, also failed ones), `lfs_stored` the objects written, in order,
`commit_parents` the `parentCommit` each commit request named.
"""

from __future__ import annotations

import base64
import contextlib
import fnmatch
import hashlib
import json
import os
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

import yaml

# What `/api/validate-yaml` accepts for a dataset card here: the Hub's vocabularies, kept in one place.
from trajforge.schemas.hub import LICENSES, SIZE_CATEGORIES  # noqa: E402

_ROUTE = re.compile(r"^/api/(?P<type>models|datasets|spaces)/(?P<repo>[^/]+/[^/]+)(?:/(?P<action>[a-z-]+)"
                    r"(?:/(?P<rest>.*))?)?$")
_LFS_BATCH = re.compile(r"^/(?:(?P<type>datasets|spaces)/)?(?P<repo>[^/]+/[^/]+)\.git/info/lfs/objects/batch$")
_LFS_OBJECT = re.compile(r"^/lfs-storage/(?P<type>model|dataset|space)/(?P<repo>[^/]+/[^/]+)/(?P<oid>[0-9a-f]{64})"
                         r"(?:/(?P<tail>verify|part/\d+))?$")
_RESOLVE = re.compile(r"^/(?:(?P<type>datasets|spaces)/)?(?P<repo>[^/]+/[^/]+)/resolve/(?P<rest>.+)$")


def git_blob_id(data: bytes) -> str:
    """The git object id of a blob: what the Hub reports as a regular file's `oid`."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(oid: str, size: int) -> bytes:
    """The git-lfs pointer file of an object: what git stores in the tree for an LFS file."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {size}\n".encode()


def lfs_patterns(gitattributes: bytes) -> list[str]:
    """The patterns a `.gitattributes` sends to LFS (`filter=lfs`)."""
    out = []
    for line in gitattributes.decode(errors="replace").splitlines():
        parts = line.split()
        if len(parts) > 1 and not parts[0].startswith("#") and "filter=lfs" in parts[1:]:
            out.append(parts[0])
    return out


def matches_lfs(path: str, patterns: list[str]) -> bool:
    """git's rule, enough for the Hub's default patterns: a pattern without `/` matches the base name."""
    return any(fnmatch.fnmatch(path if "/" in p else path.rsplit("/", 1)[-1], p.lstrip("/")) for p in patterns)


class HubError(Exception):
    def __init__(self, status: int, message: str, error_code: str | None = None, **extra: Any):
        super().__init__(message)
        self.status, self.message, self.error_code, self.extra = status, message, error_code, extra


@dataclass
class Repo:
    """One repository on disk: `blobs/<oid>`, `commits/<oid>.json`, `refs.json`."""

    root: Path
    repo_type: str
    repo_id: str
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def refs_path(self) -> Path:
        return self.root / "refs.json"

    def refs(self) -> dict[str, dict[str, str]]:
        return json.loads(self.refs_path.read_text())

    def write_refs(self, refs: dict) -> None:
        tmp = self.refs_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(refs, indent=1, sort_keys=True))
        os.replace(tmp, self.refs_path)

    def commit(self, oid: str) -> dict[str, Any]:
        return json.loads((self.root / "commits" / f"{oid}.json").read_text())

    def blob(self, oid: str) -> bytes:
        return (self.root / "blobs" / oid).read_bytes()

    def has_object(self, oid: str, size: int | None = None) -> bool:
        path = self.root / "lfs" / oid
        return path.exists() and (size is None or path.stat().st_size == size)

    def object(self, oid: str) -> bytes:
        return (self.root / "lfs" / oid).read_bytes()

    def store_object(self, oid: str, data: bytes) -> None:
        """Keep `data` as LFS object `oid` (whole or not at all); HubError when it is not that object."""
        if hashlib.sha256(data).hexdigest() != oid:
            raise HubError(400, f"LFS object {oid}: the content's sha256 is {hashlib.sha256(data).hexdigest()}")
        (self.root / "lfs").mkdir(exist_ok=True)
        tmp = self.root / "lfs" / f".{oid}.{threading.get_ident()}.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, self.root / "lfs" / oid)

    def content(self, entry: dict[str, Any]) -> bytes:
        """A tree entry's file content (an LFS file's object, not its pointer)."""
        return self.object(entry["lfs"]["oid"]) if "lfs" in entry else self.blob(entry["oid"])

    def resolve(self, revision: str) -> str:
        """A branch, a tag, a full or short commit id -> commit id (404 RevisionNotFound)."""
        rev = unquote(revision)
        refs = self.refs()
        for kind in ("branches", "tags"):
            if rev in refs[kind]:
                return refs[kind][rev]
        for prefix in ("refs/heads/", "refs/tags/"):
            if rev.startswith(prefix):
                return self.resolve(rev[len(prefix):])
        if re.fullmatch(r"[0-9a-f]{7,40}", rev):
            found = [p.stem for p in (self.root / "commits").glob(f"{rev}*.json")]
            if len(found) == 1:
                return found[0]
        raise HubError(404, f"Invalid rev id: {rev}", "RevisionNotFound")

    def write_commit(self, parent: str | None, tree: dict[str, dict], title: str, description: str) -> str:
        record = {"parent": parent, "tree": tree, "title": title, "message": description,
                  "date": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime()), "nonce": time.time_ns()}
        data = json.dumps(record, sort_keys=True).encode()
        oid = hashlib.sha1(data).hexdigest()
        (self.root / "commits" / f"{oid}.json").write_bytes(data)
        return oid


class HubServer:
    """The server and its repositories; `endpoint` is what `HfApi(endpoint=...)` / `HF_ENDPOINT` take."""

    def __init__(self, root: Path, host: str = "127.0.0.1", port: int = 0, lfs_threshold: int = 10 * 1024 * 1024,
                 multipart_threshold: int | None = None, chunk_size: int = 5 * 1024 * 1024):
        """`lfs_threshold`: files of at least this size go to LFS whatever `.gitattributes` says (the Hub:
        10 MB); objects of at least `multipart_threshold` bytes (None: never) are uploaded in parts of
        `chunk_size` bytes."""
        self.root = Path(root)
        self.lfs_threshold, self.multipart_threshold, self.chunk_size = lfs_threshold, multipart_threshold, chunk_size
        self.lfs_puts: list[str] = []  # sha256 of every object PUT (whole or a part), failed ones too
        self.lfs_stored: list[str] = []  # sha256 of every object written to storage
        self.commit_parents: list[str | None] = []  # the `parentCommit` of every commit request, in order
        self.root.mkdir(parents=True, exist_ok=True)
        self._repos: dict[tuple[str, str], Repo] = {}
        self._lock = threading.Lock()
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request, in order
        self._faults: dict[str, int] = {}
        self._stalled: set[str] = set()
        self.stalled = threading.Event()  # set when a stalled request is waiting
        self._release = threading.Event()
        self._busy = 0
        self._idle = threading.Condition()
        hub = self

        class Handler(_Handler):
            server_hub = hub

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.endpoint = f"http://{host}:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="hub-server", daemon=True)

    def start(self) -> "HubServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self.release()
        self.httpd.shutdown()
        self.httpd.server_close()

    # -- test controls -------------------------------------------------------------------------------
    def fail(self, route: str, after: int = 0) -> None:
        """Answer the (after+1)-th next request to `route` (e.g. "preupload", "commit") with a 400."""
        self._faults[route] = after

    def stall(self, route: str) -> None:
        """Hold every request to `route` until `release()` (`stalled` is set while one waits)."""
        self._release.clear()
        self.stalled.clear()
        self._stalled.add(route)

    def release(self) -> None:
        self._stalled.clear()
        self._release.set()

    def wait_idle(self, timeout: float = 60) -> bool:
        """Wait until no request is being served (e.g. one a killed client left behind); False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._busy == 0, timeout)

    def _fault(self, route: str) -> None:
        if route in self._stalled:
            self.stalled.set()
            self._release.wait(60)
        if route in self._faults:
            if self._faults[route] == 0:
                del self._faults[route]
                raise HubError(400, f"injected failure of {route}")
            self._faults[route] -= 1

    # -- repositories ---------------------------------------------------------------------------------
    def repo(self, repo_type: str, repo_id: str, create: bool = False) -> Repo:
        key = (repo_type, repo_id)
        with self._lock:
            if key in self._repos:
                if create:
                    prefix = "" if repo_type == "model" else f"{repo_type}s/"
                    raise HubError(409, f"You already created this {repo_type} repo: {repo_id}",
                                   url=f"{self.endpoint}/{prefix}{repo_id}")
                return self._repos[key]
            root = self.root / f"{repo_type}s" / repo_id
            if not create and not (root / "refs.json").exists():
                raise HubError(404, f"Repository Not Found for url: {repo_type}s/{repo_id}", "RepoNotFound")
            repo = Repo(root, repo_type, repo_id)
            if create:
                (root / "blobs").mkdir(parents=True, exist_ok=True)
                (root / "commits").mkdir(exist_ok=True)
                attrs = b"*.parquet filter=lfs diff=lfs merge=lfs -text\n"
                (root / "blobs" / git_blob_id(attrs)).write_bytes(attrs)
                head = repo.write_commit(None, {".gitattributes": {"oid": git_blob_id(attrs), "size": len(attrs)}},
                                         "initial commit", "")
                repo.write_refs({"branches": {"main": head}, "tags": {}})
            self._repos[key] = repo
            return repo

    def head(self, repo_id: str, revision: str = "main", repo_type: str = "dataset") -> str:
        return self.repo(repo_type, repo_id).resolve(revision)

    def files(self, repo_id: str, revision: str = "main", repo_type: str = "dataset") -> dict[str, bytes]:
        """path -> content at `revision` (for assertions)."""
        repo = self.repo(repo_type, repo_id)
        tree = repo.commit(repo.resolve(revision))["tree"]
        return {p: repo.content(e) for p, e in tree.items()}

    def lfs_files(self, repo_id: str, revision: str = "main", repo_type: str = "dataset") -> dict[str, str]:
        """path -> sha256 of every LFS file at `revision`."""
        repo = self.repo(repo_type, repo_id)
        tree = repo.commit(repo.resolve(revision))["tree"]
        return {p: e["lfs"]["oid"] for p, e in tree.items() if "lfs" in e}

    def objects(self, repo_id: str, repo_type: str = "dataset") -> set[str]:
        """sha256 of every LFS object storage holds for the repo (committed or only uploaded)."""
        folder = self.repo(repo_type, repo_id).root / "lfs"
        return {p.name for p in folder.iterdir() if not p.name.startswith(".")} if folder.exists() else set()

    def history(self, repo_id: str, revision: str = "main", repo_type: str = "dataset") -> list[dict[str, Any]]:
        """Commits reachable from `revision`, newest first (each with its `id`)."""
        repo = self.repo(repo_type, repo_id)
        out, oid = [], repo.resolve(revision)
        while oid:
            c = repo.commit(oid)
            out.append({"id": oid, **c})
            oid = c["parent"]
        return out


def _file_entry(path: str, entry: dict[str, Any]) -> dict[str, Any]:
    out = {"type": "file", "path": path, "oid": entry["oid"], "size": entry["size"]}
    if "lfs" in entry:
        out["lfs"] = dict(entry["lfs"])
    return out


def _tree_entries(tree: dict[str, dict], folder: str, recursive: bool) -> list[dict[str, Any]]:
    prefix = f"{folder.strip('/')}/" if folder.strip("/") else ""
    files, dirs = [], set()
    for path, entry in sorted(tree.items()):
        if not path.startswith(prefix):
            continue
        rest = path[len(prefix):]
        parts = rest.split("/")
        for i in range(1, len(parts)):
            if recursive or i == 1:
                dirs.add(prefix + "/".join(parts[:i]))
        if recursive or len(parts) == 1:
            files.append(_file_entry(path, entry))
    if prefix and not files and not dirs:
        raise HubError(404, f"Entry not found: {folder}", "EntryNotFound")
    out = [{"type": "directory", "path": d, "oid": hashlib.sha1(d.encode()).hexdigest(), "size": 0}
           for d in sorted(dirs)]
    return out + files


class _Handler(BaseHTTPRequestHandler):
    server_hub: HubServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    # -- plumbing ---------------------------------------------------------------------------------------
    def _body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            chunks = []
            while True:
                n = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if n == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(n))
                self.rfile.readline()
        n = int(self.headers.get("Content-Length") or 0)
        data = self.rfile.read(n) if n else b""
        if len(data) != n:
            raise HubError(400, f"truncated body: {len(data)} of {n} bytes")
        return data

    def _send(self, status: int, payload: Any = None, headers: dict[str, str] | None = None, raw: bytes | None = None,
              head: bool = False) -> None:
        body = raw if raw is not None else (b"" if payload is None else json.dumps(payload).encode())
        self.send_response(status)
        if raw is None:
            self.send_header("Content-Type", "application/json")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _dispatch(self, method: str) -> None:
        hub = self.server_hub
        url = urlsplit(self.path)
        hub.requests.append((method, url.path))
        with hub._idle:
            hub._busy += 1
        try:
            self._route(method, url.path, parse_qs(url.query))
        except HubError as err:
            headers = {"X-Error-Message": err.message}
            if err.error_code:
                headers["X-Error-Code"] = err.error_code
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self._send(err.status, {"error": err.message, **err.extra}, headers=headers, head=method == "HEAD")
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            with hub._idle:
                hub._busy -= 1
                hub._idle.notify_all()

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    # -- routes -----------------------------------------------------------------------------------------
    def _route(self, method: str, path: str, query: dict[str, list[str]]) -> None:
        hub = self.server_hub
        if method == "POST" and path == "/api/repos/create":
            body = json.loads(self._body())
            repo_type = body.get("type") or "model"
            repo_id = f"{body['organization']}/{body['name']}" if body.get("organization") else f"user/{body['name']}"
            hub.repo(repo_type, repo_id, create=True)
            prefix = "" if repo_type == "model" else f"{repo_type}s/"
            return self._send(200, {"url": f"{hub.endpoint}/{prefix}{repo_id}", "name": repo_id, "id": repo_id})
        if method == "POST" and path == "/api/validate-yaml":
            return self._validate_yaml(json.loads(self._body()))
        if method == "GET" and path == "/api/whoami-v2":
            return self._send(200, {"type": "user", "name": "tester", "orgs": [], "auth": {}})
        m = _LFS_BATCH.match(path)
        if m and method == "POST":
            return self._lfs_batch(hub.repo((m["type"] or "models")[:-1], m["repo"]), json.loads(self._body()))
        m = _LFS_OBJECT.match(path)
        if m and method in ("PUT", "POST"):
            return self._lfs_object(method, hub.repo(m["type"], m["repo"]), m["oid"], m["tail"] or "")
        m = _RESOLVE.match(path)
        if m and method in ("GET", "HEAD"):
            return self._resolve(method, (m["type"] or "models")[:-1], m["repo"], m["rest"])
        m = _ROUTE.match(path)
        if not m:
            raise HubError(404, f"no route for {method} {path}")
        repo_type, action, rest = m["type"][:-1], m["action"], m["rest"] or ""
        repo = hub.repo(repo_type, m["repo"])
        if action in (None, "revision") and method == "GET":
            return self._info(repo, rest or "main")
        if action == "tree" and method == "GET":
            rev, _, folder = rest.partition("/")
            with repo.lock:
                oid = repo.resolve(rev)
                tree = repo.commit(oid)["tree"]
            entries = _tree_entries(tree, unquote(folder), query.get("recursive", ["false"])[0].lower() == "true")
            if query.get("expand", ["false"])[0].lower() == "true":
                c = repo.commit(oid)
                for e in entries:
                    e["lastCommit"] = {"id": oid, "title": c["title"], "date": c["date"]}
            return self._send(200, entries)
        if action == "paths-info" and method == "POST":
            form = parse_qs(self._body().decode())
            with repo.lock:
                oid = repo.resolve(rest)
                tree = repo.commit(oid)["tree"]
            out = []
            for p in form.get("paths", []):
                p = p.strip("/")
                if p in tree:
                    out.append(_file_entry(p, tree[p]))
                elif any(k.startswith(p + "/") for k in tree):
                    out.append({"type": "directory", "path": p, "oid": hashlib.sha1(p.encode()).hexdigest(), "size": 0})
            return self._send(200, out)
        if action == "refs" and method == "GET":
            refs = repo.refs()
            fmt = lambda kind, prefix: [{"name": n, "ref": f"refs/{prefix}/{n}", "targetCommit": o}  # noqa: E731
                                        for n, o in sorted(refs[kind].items())]
            return self._send(200, {"branches": fmt("branches", "heads"), "tags": fmt("tags", "tags"),
                                    "converts": [], "pullRequests": []})
        if action == "commits" and method == "GET":
            hist = hub.history(repo.repo_id, rest or "main", repo_type)
            return self._send(200, [{"id": c["id"], "title": c["title"], "message": c["message"], "date": c["date"],
                                     "authors": [{"user": "tester"}]} for c in hist])
        if action == "preupload" and method == "POST":
            return self._preupload(repo, rest, json.loads(self._body()))
        if action == "commit" and method == "POST":
            return self._commit(repo, rest, self._body())
        if action in ("branch", "tag"):
            return self._ref(repo, action, method, unquote(rest))
        if action in ("xet-write-token", "xet-read-token"):
            raise HubError(501, "this Hub stores large files with LFS only, no Xet: set HF_HUB_DISABLE_XET=1")
        raise HubError(404, f"no route for {method} {path}")

    def _info(self, repo: Repo, revision: str) -> None:
        with repo.lock:
            oid = repo.resolve(revision)
            c = repo.commit(oid)
        card = {}
        if "README.md" in c["tree"]:
            text = repo.blob(c["tree"]["README.md"]["oid"]).decode()
            if text.startswith("---"):
                card = yaml.safe_load(text.split("---", 2)[1]) or {}
        self._send(200, {"id": repo.repo_id, "author": repo.repo_id.split("/")[0], "sha": oid, "private": False,
                         "gated": False, "disabled": False, "downloads": 0, "likes": 0, "tags": card.get("tags", []),
                         "cardData": card, "lastModified": c["date"], "createdAt": c["date"],
                         "siblings": [{"rfilename": p} for p in sorted(c["tree"])]})

    def _validate_yaml(self, body: dict) -> None:
        text = body.get("content", "")
        errors, warnings = [], []
        meta: dict = {}
        if text.startswith("---"):
            try:
                meta = yaml.safe_load(text.split("---", 2)[1]) or {}
            except yaml.YAMLError as err:
                errors.append(f"invalid YAML: {err}")
        else:
            warnings.append("empty or missing yaml metadata in repo card")
        licenses = meta.get("license") or []
        for lic in [licenses] if isinstance(licenses, str) else licenses:
            if lic not in LICENSES:
                errors.append(f'"license" must be one of the Hub\'s license identifiers, got {lic!r}')
        if "other" in ([licenses] if isinstance(licenses, str) else licenses):
            for key in ("license_name", "license_link"):
                if not meta.get(key):
                    errors.append(f'"{key}" is required when "license" is "other"')
        sizes = meta.get("size_categories") or []
        for s in [sizes] if isinstance(sizes, str) else sizes:
            if s not in SIZE_CATEGORIES:
                errors.append(f'"size_categories" must be one of {sorted(SIZE_CATEGORIES)}, got {s!r}')
        for cfg in meta.get("configs") or []:
            if not isinstance(cfg, dict) or "config_name" not in cfg or "data_files" not in cfg:
                errors.append(f'"configs" entries need "config_name" and "data_files", got {cfg!r}')
        if errors:
            return self._send(400, {"errors": [{"message": e} for e in errors], "warnings": []},
                              headers={"X-Error-Message": "; ".join(errors)})
        self._send(200, {"errors": [], "warnings": [{"message": w} for w in warnings]})

    def _preupload(self, repo: Repo, revision: str, body: dict) -> None:
        self.server_hub._fault("preupload")
        with repo.lock:
            head = repo.resolve(revision)
            tree = repo.commit(head)["tree"]
            attrs = repo.content(tree[".gitattributes"]) if ".gitattributes" in tree else b""
        patterns = lfs_patterns(attrs)
        files = []
        for f in body["files"]:
            lfs = matches_lfs(f["path"], patterns) or int(f.get("size") or 0) >= self.server_hub.lfs_threshold
            entry = tree.get(f["path"], {})
            remote = (entry.get("lfs") or {}).get("oid") if lfs else (None if "lfs" in entry else entry.get("oid"))
            files.append({"path": f["path"], "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False,
                          "oid": remote})
        self._send(200, {"files": files, "commitOid": head})

    def _lfs_batch(self, repo: Repo, body: dict) -> None:
        """The git-lfs batch API: per object, upload (+ verify) actions, or none when storage holds it."""
        hub = self.server_hub
        hub._fault("lfs-batch")
        if body.get("operation") != "upload":
            raise HubError(400, f"LFS batch: operation {body.get('operation')!r} is not supported here")
        transfers = body.get("transfers") or ["basic"]
        base = f"{hub.endpoint}/lfs-storage/{repo.repo_type}/{repo.repo_id}"
        multipart = "multipart" in transfers and hub.multipart_threshold is not None
        objects, chosen = [], "basic"
        for obj in body.get("objects", []):
            oid, size = obj["oid"], int(obj["size"])
            if not re.fullmatch(r"[0-9a-f]{64}", oid):
                objects.append({"oid": oid, "size": size, "error": {"code": 422, "message": "oid must be a sha256"}})
                continue
            if repo.has_object(oid, size):
                objects.append({"oid": oid, "size": size})  # no actions: the client sends nothing
                continue
            upload: dict[str, Any] = {"href": f"{base}/{oid}"}
            if multipart and size >= hub.multipart_threshold:
                chosen = "multipart"
                n = -(-size // hub.chunk_size)
                upload["header"] = {"chunk_size": str(hub.chunk_size),
                                    **{str(i): f"{base}/{oid}/part/{i}" for i in range(1, n + 1)}}
            objects.append({"oid": oid, "size": size, "authenticated": True,
                            "actions": {"upload": upload, "verify": {"href": f"{base}/{oid}/verify"}}})
        self._send(200, {"transfer": chosen, "objects": objects, "hash_algo": "sha256"},
                   headers={"Content-Type": "application/vnd.git-lfs+json"})

    def _lfs_object(self, method: str, repo: Repo, oid: str, tail: str) -> None:
        """PUT `<oid>`: a whole object (basic); PUT `<oid>/part/<n>`: a part (answers its ETag); POST
        `<oid>`: complete a multipart upload from the parts' etags; POST `<oid>/verify`: is it stored?"""
        hub = self.server_hub
        parts_dir = repo.root / "lfs-parts" / oid
        if method == "PUT":
            hub.lfs_puts.append(oid)
            data = self._body()
            hub._fault("lfs-upload")
            if tail.startswith("part/"):
                parts_dir.mkdir(parents=True, exist_ok=True)
                (parts_dir / tail.split("/")[1]).write_bytes(data)
                return self._send(200, raw=b"", headers={"ETag": f'"{hashlib.md5(data).hexdigest()}"'})
            repo.store_object(oid, data)
            hub.lfs_stored.append(oid)
            return self._send(200, raw=b"")
        body = json.loads(self._body() or b"{}")
        if tail == "verify":
            hub._fault("lfs-verify")
            if not repo.has_object(oid, int(body.get("size", -1))):
                raise HubError(404, f"LFS object {oid} of size {body.get('size')} was not uploaded")
            return self._send(200, {"success": True})
        parts = sorted(body.get("parts", []), key=lambda p: p["partNumber"])
        data = b""
        for p in parts:
            chunk = (parts_dir / str(p["partNumber"])).read_bytes() if (parts_dir / str(p["partNumber"])).exists() \
                else None
            if chunk is None or f'"{hashlib.md5(chunk).hexdigest()}"' != p["etag"]:
                raise HubError(400, f"LFS object {oid}: part {p['partNumber']} is missing or its etag differs")
            data += chunk
        repo.store_object(oid, data)
        hub.lfs_stored.append(oid)
        self._send(200, {"success": True})

    def _commit(self, repo: Repo, revision: str, body: bytes) -> None:
        self.server_hub._fault("commit")
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        if not lines or lines[0].get("key") != "header":
            raise HubError(400, "the commit payload must start with a header line")
        header = lines[0]["value"]
        self.server_hub.commit_parents.append(header.get("parentCommit"))
        branch = unquote(revision)
        with repo.lock:
            refs = repo.refs()
            if branch not in refs["branches"]:
                raise HubError(404, f"Invalid rev id: {branch} (commits go to a branch)", "RevisionNotFound")
            head = refs["branches"][branch]
            parent = header.get("parentCommit")
            if parent and not head.startswith(parent):
                raise HubError(412, f"A commit has happened since. Please refresh and try again. "
                                    f"(parentCommit {parent} is not the head {head} of {branch})")
            tree = dict(repo.commit(head)["tree"])
            blobs: dict[str, bytes] = {}
            for item in lines[1:]:
                key, value = item["key"], item["value"]
                path = value["path"].strip("/")
                if key == "file":
                    data = base64.b64decode(value["content"]) if value.get("encoding") == "base64" else \
                        value["content"].encode()
                    oid = git_blob_id(data)
                    blobs[oid] = data
                    tree[path] = {"oid": oid, "size": len(data)}
                elif key == "deletedFile":
                    if path not in tree:
                        raise HubError(404, f"A file with this name doesn't exist: {path}", "EntryNotFound")
                    del tree[path]
                elif key == "deletedFolder":
                    gone = [p for p in tree if p.startswith(path + "/")]
                    if not gone:
                        raise HubError(404, f"A folder with this name doesn't exist: {path}", "EntryNotFound")
                    for p in gone:
                        del tree[p]
                elif key == "lfsFile":
                    oid, size = value["oid"], int(value["size"])
                    if value.get("algo", "sha256") != "sha256" or not repo.has_object(oid, size):
                        raise HubError(422, f"Your push was rejected because an LFS pointer pointed to a file "
                                            f"that does not exist: {path} ({oid}, {size} bytes)", "LfsObjectMissing")
                    pointer = lfs_pointer(oid, size)
                    blobs[git_blob_id(pointer)] = pointer
                    tree[path] = {"oid": git_blob_id(pointer), "size": size,
                                  "lfs": {"oid": oid, "size": size, "pointerSize": len(pointer)}}
                else:
                    raise HubError(400, f"unsupported commit operation {key!r}")
            for oid, data in blobs.items():
                (repo.root / "blobs" / oid).write_bytes(data)
            oid = repo.write_commit(head, tree, header.get("summary", ""), header.get("description", ""))
            refs["branches"][branch] = oid
            repo.write_refs(refs)
        self.server_hub._fault("commit-applied")
        prefix = "" if repo.repo_type == "model" else f"{repo.repo_type}s/"
        self._send(200, {"success": True, "commitOid": oid,
                         "commitUrl": f"{self.server_hub.endpoint}/{prefix}{repo.repo_id}/commit/{oid}"})

    def _ref(self, repo: Repo, kind: str, method: str, name: str) -> None:
        kinds = "branches" if kind == "branch" else "tags"
        self.server_hub._fault(kind)
        body = json.loads(self._body() or b"{}") if method == "POST" else {}
        with repo.lock:
            refs = repo.refs()
            if method == "DELETE":
                if name not in refs[kinds] or (kind == "branch" and name == "main"):
                    raise HubError(404 if name not in refs[kinds] else 403, f"cannot delete {kind} {name}")
                del refs[kinds][name]
            elif kind == "tag":  # POST /tag/<revision> {"tag": name}
                tag = body["tag"]
                if tag in refs["tags"]:
                    raise HubError(409, f"Tag {tag} already exists")
                refs["tags"][tag] = repo.resolve(name)
            else:  # POST /branch/<name> {"startingPoint": revision}
                if name in refs["branches"]:
                    raise HubError(409, f"Branch {name} already exists")
                refs["branches"][name] = repo.resolve(body.get("startingPoint") or "main")
            repo.write_refs(refs)
        self.server_hub._fault(f"{kind}-applied")
        self._send(200, {})

    def _resolve(self, method: str, repo_type: str, repo_id: str, rest: str) -> None:
        repo = self.server_hub.repo(repo_type, repo_id)
        rev, _, path = rest.partition("/")
        path = unquote(path)
        with repo.lock:
            oid = repo.resolve(rev)
            tree = repo.commit(oid)["tree"]
        if path not in tree:
            raise HubError(404, f"Entry not found: {path}", "EntryNotFound")
        entry = tree[path]
        data = repo.content(entry)
        etag = entry["lfs"]["oid"] if "lfs" in entry else entry["oid"]
        headers = {"X-Repo-Commit": oid, "ETag": f'"{etag}"', "Accept-Ranges": "bytes",
                   "Content-Disposition": f"inline; filename*=UTF-8''{quote(path.rsplit('/', 1)[-1])}"}
        if "lfs" in entry:  # what the Hub's CDN redirect carries: the object's sha256 and size
            headers.update({"X-Linked-Etag": f'"{etag}"', "X-Linked-Size": str(entry["size"])})
        m = re.fullmatch(r"bytes=(\d*)-(\d*)", self.headers.get("Range") or "")
        if m and method == "GET":
            start = int(m[1]) if m[1] else max(0, len(data) - int(m[2]))
            end = int(m[2]) if m[1] and m[2] else len(data) - 1
            end = min(end, len(data) - 1)
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            return self._send(206, raw=data[start:end + 1], headers=headers)
        self._send(200, raw=data, headers=headers, head=method == "HEAD")
