"""`trajforge publish`: a committed build's dataset folder to a Hugging Face Hub dataset repo, atomically.

A build becomes visible on the default branch in ONE commit: the card and every data file of the
build land together, and data files of the previous version (file names carry the export
fingerprint) are deleted in that same commit. `upload_folder` is not used: since huggingface_hub
1.20 it splits large uploads into several commits, so readers could see deletions or the card
before the data. Instead the data files are pre-uploaded in batches (`preupload_lfs_files`: LFS /
Xet content goes to storage, nothing is visible; a re-run skips what storage already holds), then
one `create_commit` with every addition and deletion, guarded by `parent_commit` (the branch head
seen when planning: a concurrent change makes the commit fail instead of being overwritten). Then
the commit is tagged `<build id>`, so every published version stays loadable by `revision=<build id>`.

Idempotent: files whose content the branch already holds are not sent; a build whose tag exists is
a no-op that says so; a build the branch already holds (a run that died before tagging) is only
tagged; a build tagged but not recorded (a run that died after tagging) is only recorded. An
interrupted publish leaves the branch at the previous build, or at the new one in full when it died
after the Hub accepted the commit, never between; running it again completes it. The publication
is recorded in `<build>/published.json` (revision, tag, files and sizes).

Invariants: only a committed build with an export manifest whose stats record a secrets scan is
published; nothing is uploaded when the card declares no config; the token comes from `--token`,
`$HF_TOKEN` or the huggingface_hub login; the endpoint from `endpoint`, `$HF_ENDPOINT` or the Hub.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import hashlib
import os
import posixpath
import tempfile
from typing import Any

from ..tasks.dataset.card import CardError, hub_usage, validate_card
from ..tasks.dataset.env_tree import EnvTreeError, environment_tree
from ..tasks.engine.store import RunStore

BRANCH = "main"


class PublishError(RuntimeError):
    """The build cannot be published (not committed, no export, not scanned, nothing declared)."""


def dataset_folder(store: RunStore, build_id: str) -> str:
    """The export folder of a committed build (raises PublishError naming what is missing)."""
    rec = store.read_build(build_id)
    if rec is None:
        raise PublishError(f"build {build_id!r} not found under {store.url(store.root)} "
                           f"(builds: {', '.join(store.builds()[-5:]) or 'none'})")
    if rec.status != "committed":
        raise PublishError(f"build {build_id} is {rec.status!r}, not committed: finish it "
                           f"(`trajforge build` resumes it) before publishing")
    export = rec.committed("export")
    if not export or not store.exists(posixpath.join(export, "manifest.json")):
        raise PublishError(f"build {build_id} has no committed export stage")
    return export


def require_secrets_scan(store: RunStore, export_dir: str) -> dict[str, Any]:
    """The export's secrets-scan record (`stats.json` key `secrets`); PublishError when the export was
    not scanned (an export made before the scan existed: re-run it with `trajforge stage export --build ID`)."""
    path = posixpath.join(export_dir, "stats.json")
    stats = store.read_json(path) if store.exists(path) else {}
    if not isinstance(stats.get("secrets"), dict):
        raise PublishError(f"the export {store.url(export_dir)} was not scanned for secrets (no `secrets` in "
                           f"stats.json): re-run it with `trajforge stage export --build <id>` before publishing")
    return stats["secrets"]


def declared_configs(card: str) -> list[str]:
    """Config names in the card's YAML header."""
    if not card.startswith("---"):
        return []
    import yaml

    header = yaml.safe_load(card.split("---", 2)[1]) or {}
    return [c["config_name"] for c in header.get("configs", [])]


def _data_files(store: RunStore, folder: str, header: dict[str, Any]) -> dict[str, str]:
    """repo path -> store path of every file the card's configs declare."""
    out: dict[str, str] = {}
    for cfg in header.get("configs", []):
        for df in cfg["data_files"]:
            for pattern in [df["path"]] if isinstance(df["path"], str) else df["path"]:
                for src in sorted(store.fs.glob(posixpath.join(folder, pattern))):
                    out[posixpath.relpath(src, folder)] = src
    return out


def _git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _hashes(path: str, chunk: int = 1 << 20) -> tuple[str, str, int]:
    """(sha256, git blob id, size) of a local file, read in chunks."""
    size = os.path.getsize(path)
    sha256, git = hashlib.sha256(), hashlib.sha1(b"blob %d\0" % size)
    with open(path, "rb") as f:
        while block := f.read(chunk):
            sha256.update(block)
            git.update(block)
    return sha256.hexdigest(), git.hexdigest(), size


def _same(remote: Any, data_sha256: str, data_git: str) -> bool:
    """Whether a remote RepoFile holds this content (LFS/Xet: sha256; regular: git blob id)."""
    lfs = getattr(remote, "lfs", None)
    return (lfs.sha256 == data_sha256) if lfs else (remote.blob_id == data_git)


def _is_data_file(path: str) -> bool:
    """What a trajforge export publishes besides the card: `<config>/<file>.parquet`."""
    return "/" in path and fnmatch.fnmatch(path, "*/*.parquet")


def _history(store: RunStore, build_id: str) -> tuple[str, list[dict[str, Any]]]:
    path = posixpath.join(store.build_dir(build_id), "published.json")
    return path, (store.read_json(path) if store.exists(path) else [])


def publish(store: RunStore, build_id: str, repo_id: str, *, private: bool = False, token: str | None = None,
            tag: bool = True, api: Any = None, endpoint: str | None = None, batch_files: int = 100,
            say: Any = None, environments: str | None = None) -> dict[str, Any]:
    """Publish the build's dataset folder to `repo_id` (created if missing) in one commit on `main`,
    tagged with the build id; returns the record appended to `<build>/published.json` (`status`:
    `published`, `tagged` = the branch already held it, or `unchanged` = already published).
    `api` defaults to `huggingface_hub.HfApi(endpoint=endpoint)`; `batch_files` data files are
    pre-uploaded per request; `say(str)` receives progress lines. `environments` (`none`, `rl`, `kept`)
    adds the build's environments as a Harbor task tree under `tasks/` in the same commit, declared in
    the card (tasks/dataset/env_tree.py); a tree of an earlier build is deleted in that commit."""
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete
    from huggingface_hub.errors import HfHubHTTPError

    say = say or (lambda _msg: None)
    folder = dataset_folder(store, build_id)
    require_secrets_scan(store, folder)
    card = store.fs.cat(posixpath.join(folder, "README.md")).decode()
    try:
        header = validate_card(card)
    except CardError as err:
        raise PublishError(f"build {build_id}: {err}") from None
    configs = [c["config_name"] for c in header.get("configs", [])]
    if not configs:
        raise PublishError(f"build {build_id}: the dataset card declares no config (every config is empty)")
    try:  # before anything is sent: an environment that cannot be exported publishes nothing
        tree = environment_tree(store, build_id, environments)
    except EnvTreeError as err:
        raise PublishError(f"build {build_id}: {err}") from None
    card = tree.declare(card, repo_id)
    if api is None:
        from huggingface_hub import HfApi

        api = HfApi(endpoint=endpoint or None, token=token or os.environ.get("HF_TOKEN"))
    record_path, history = _history(store, build_id)
    api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=True)
    refs = api.list_repo_refs(repo_id, repo_type="dataset")
    tags = {t.name: t.target_commit for t in refs.tags}
    head = next((b.target_commit for b in refs.branches if b.name == BRANCH), None)
    if tag and build_id in tags:
        say(f"build {build_id} is already published to {repo_id} (tag {build_id} = {tags[build_id][:12]}); "
            + ("it is the head of main" if head == tags[build_id] else f"main is at {(head or '?')[:12]}")
            + ": nothing to do")
        previous = next((r for r in reversed(history) if r.get("repo_id") == repo_id and r.get("revision")), None)
        if previous is None:  # the run that tagged it died before recording it: record what the tag holds
            files = [{"path": f.path, "size": f.size} for f in api.list_repo_tree(
                repo_id, repo_type="dataset", recursive=True, revision=tags[build_id])
                if hasattr(f, "blob_id") and f.path != ".gitattributes"]
            previous = {"repo_id": repo_id, "build_id": build_id, "revision": tags[build_id],
                        "commit": tags[build_id], "url": None, "tag": build_id, "configs": configs,
                        "private": private, "status": "unchanged", "endpoint": getattr(api, "endpoint", None),
                        "files": sorted(files, key=lambda f: f["path"]),
                        "at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
            store.write_json(record_path, [*history, previous])
        return {**previous, "status": "unchanged"}
    revisions = sorted(t for t in tags if t != build_id) + ([build_id] if tag else [])
    card_bytes = hub_usage(card, repo_id, revisions[-10:]).encode()

    files = _data_files(store, folder, header)
    remote = {f.path: f for f in api.list_repo_tree(repo_id, repo_type="dataset", recursive=True, revision=head)
              if hasattr(f, "blob_id")}
    with tempfile.TemporaryDirectory(prefix="trajforge-publish-") as tmp:
        adds, sizes = [], {}
        for rel, src in sorted(files.items()):
            local = src if store.local else os.path.join(tmp, rel)
            if not store.local:  # object store: upload from a local copy
                os.makedirs(os.path.dirname(local), exist_ok=True)
                store.fs.get(src, local)
            sha256, git, sizes[rel] = _hashes(local)
            if rel not in remote or not _same(remote[rel], sha256, git):
                adds.append(CommitOperationAdd(path_in_repo=rel, path_or_fileobj=local))
        adds += [CommitOperationAdd(path_in_repo=p, path_or_fileobj=data) for p, data in tree.files.items()
                 if p not in remote or not _same(remote[p], hashlib.sha256(data).hexdigest(), _git_blob_id(data))]
        sizes.update({p: len(data) for p, data in tree.files.items()})
        sizes["README.md"] = len(card_bytes)
        card_changed = "README.md" not in remote or remote["README.md"].blob_id != _git_blob_id(card_bytes)
        deletes = [CommitOperationDelete(path_in_repo=p) for p in sorted(remote) if p not in files
                   and p not in tree.files and (_is_data_file(p) or tree.stale(p, remote))]
        if adds or deletes or card_changed:
            for i in range(0, len(adds), batch_files):  # storage only: nothing visible until the commit
                batch = adds[i:i + batch_files]
                api.preupload_lfs_files(repo_id, additions=batch, repo_type="dataset", revision=BRANCH)
                say(f"uploaded {min(i + batch_files, len(adds))}/{len(adds)} data files")
            ops = [*adds, CommitOperationAdd(path_in_repo="README.md", path_or_fileobj=card_bytes), *deletes]
            try:
                commit = api.create_commit(
                    repo_id, ops, repo_type="dataset", revision=BRANCH, parent_commit=head,
                    commit_message=f"trajforge build {build_id}",
                    commit_description=f"configs: {', '.join(configs)}; {len(adds)} files added, "
                                       f"{len(deletes)} deleted")
            except HfHubHTTPError as err:
                if err.response is not None and err.response.status_code == 412:
                    raise PublishError(f"{repo_id}: main changed while publishing {build_id} (someone else "
                                       "committed); run publish again") from None
                raise
            revision, url, status = commit.oid, getattr(commit, "commit_url", None), "published"
            say(f"committed {len(adds)} files (+ card), deleted {len(deletes)} on main: {revision[:12]}")
        else:  # main already holds exactly this build (an earlier run died before tagging)
            revision, url, status = head, None, "tagged" if tag else "unchanged"
            say(f"main already holds build {build_id} ({(head or '?')[:12]})"
                + (": tagging only" if tag else ": nothing to do"))
    if tag:
        api.create_tag(repo_id, tag=build_id, repo_type="dataset", revision=revision, exist_ok=True)
    record = {"repo_id": repo_id, "build_id": build_id, "revision": revision, "commit": revision, "url": url,
              "tag": build_id if tag else None, "configs": configs, "private": private, "status": status,
              "endpoint": getattr(api, "endpoint", None),
              "files": [{"path": p, "size": s} for p, s in sorted(sizes.items())],
              "at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    store.write_json(record_path, [*history, record])
    return record
