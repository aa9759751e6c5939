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

When the branch moved under the commit (the Hub answers 412), the publish says so, re-lists the new
head and re-plans against it; it retries there (at most `attempts` commits) only when the other
writer changed no path this commit writes or deletes: a newer build published meanwhile (its data
files and card) or an edited card stops it with ConcurrentChangeError, nothing committed. The same
build published meanwhile by another run is simply recorded.

Append (`append=True`): the build's data files are added next to those of the last build tagged on
the branch (the commit's parent is that tag's commit, nothing is deleted, the card's data_files name
both builds' shards), after every shared config's Arrow schema was checked equal to the published one
(flows/publish_append.py; SchemaChangeError otherwise, before any upload).

Idempotent: files whose content the branch already holds are not sent; a build whose tag exists is
a no-op that says so; a build the branch already holds (a run that died before tagging) is only
tagged; a build tagged but not recorded (a run that died after tagging) is only recorded. An
interrupted publish leaves the branch at the previous build, or at the new one in full when it died
after the Hub accepted the commit, never between; running it again completes it. The publication
is recorded in `<build>/published.json` (revision, tag, files and sizes).

Large files: the Hub's `.gitattributes` sends `*.parquet` to large-file storage. huggingface_hub 2.x
uploads them through Xet whenever `hf_xet` is installed (the client decides, not the server), else
(or with `HF_HUB_DISABLE_XET=1`) through the LFS batch API: upload, verify, and no upload for an
object storage already holds. Tests drive the LFS path against tests/hub_server.py.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..tasks.dataset.card import CardError, hub_usage, validate_card
from ..tasks.dataset.env_tree import EnvTree, EnvTreeError, environment_tree
from ..tasks.engine.store import RunStore

BRANCH = "main"


class PublishError(RuntimeError):
    """The build cannot be published (not committed, no export, not scanned, nothing declared)."""


class UploadRefusedError(PublishError):
    """The Hub refused a data file's upload: nothing was committed (what it stored stays, not re-sent)."""


class ConcurrentChangeError(PublishError):
    """`main` moved under the commit and the retry would overwrite what the other writer committed (or
    the retries ran out): nothing was committed."""


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


@dataclass
class _Local:
    """A data file of the build, on local disk (a copy when the store is remote)."""

    path: str
    sha256: str
    git: str
    size: int


@dataclass
class _Plan:
    """What one commit on top of `parent` changes."""

    parent: str | None
    adds: list[Any]
    deletes: list[Any]
    card_changed: bool

    @property
    def writes(self) -> set[str]:
        """Repo paths this commit sets or deletes."""
        return {op.path_in_repo for op in [*self.adds, *self.deletes]} | ({"README.md"} if self.card_changed else set())


def _refs(api: Any, repo_id: str) -> tuple[dict[str, str], str | None]:
    refs = api.list_repo_refs(repo_id, repo_type="dataset")
    return {t.name: t.target_commit for t in refs.tags}, next(
        (b.target_commit for b in refs.branches if b.name == BRANCH), None)


def _tree(api: Any, repo_id: str, revision: str | None) -> dict[str, Any]:
    """repo path -> RepoFile at `revision` (files only)."""
    return {f.path: f for f in api.list_repo_tree(repo_id, repo_type="dataset", recursive=True, revision=revision)
            if hasattr(f, "blob_id")}


def _content_id(f: Any) -> str:
    lfs = getattr(f, "lfs", None)
    return lfs.sha256 if lfs else f.blob_id


def _localize(store: RunStore, files: dict[str, str], tree: EnvTree, tmp: str) -> dict[str, _Local]:
    """repo path -> the build's data file (or environment tree file, already on disk) on local disk, hashed
    (an object store's files are copied to `tmp`)."""
    out = {rel: _Local(str(path), *_hashes(str(path))) for rel, path in sorted(tree.files.items())}
    for rel, src in sorted(files.items()):
        local = src if store.local else os.path.join(tmp, rel)
        if not store.local:
            os.makedirs(os.path.dirname(local), exist_ok=True)
            store.fs.get(src, local)
        out[rel] = _Local(local, *_hashes(local))
    return out


def _plan(api: Any, repo_id: str, parent: str | None, local: dict[str, _Local], card_bytes: bytes, append: bool,
          ops: dict[str, Any], tree: EnvTree) -> _Plan:
    """Additions (files whose content `parent` does not hold), deletions (data files of `parent` the build
    does not have, and files of an earlier environment tree this one does not hold; none when appending)
    and whether the card changes. `ops` keeps one CommitOperationAdd
    per path across re-plans (an operation already pre-uploaded is not uploaded again)."""
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete

    remote = _tree(api, repo_id, parent)
    adds = []
    for rel, f in local.items():
        if rel not in remote or not _same(remote[rel], f.sha256, f.git):
            adds.append(ops.setdefault(rel, CommitOperationAdd(path_in_repo=rel, path_or_fileobj=f.path)))
    deletes = [] if append else [CommitOperationDelete(path_in_repo=p) for p in sorted(remote)
                                 if (_is_data_file(p) or tree.stale(p, remote)) and p not in local]
    card_changed = "README.md" not in remote or remote["README.md"].blob_id != _git_blob_id(card_bytes)
    return _Plan(parent, adds, deletes, card_changed)


def _upload(api: Any, repo_id: str, adds: list[Any], batch_files: int, say: Any) -> None:
    """Pre-upload `adds` in batches (storage only: nothing visible until the commit; the LFS batch API
    skips objects storage already holds). A refusal raises UploadRefusedError naming the batch."""
    from huggingface_hub.errors import HfHubHTTPError

    for i in range(0, len(adds), batch_files):
        batch = adds[i:i + batch_files]
        try:
            api.preupload_lfs_files(repo_id, additions=batch, repo_type="dataset", revision=BRANCH)
        except (HfHubHTTPError, OSError, ValueError, RuntimeError) as err:
            names = ", ".join(op.path_in_repo for op in batch[:3]) + (" …" if len(batch) > 3 else "")
            cause = err.__cause__ or err
            raise UploadRefusedError(f"{repo_id}: the Hub refused uploading {names} ({err}; {cause}); nothing was "
                                     "committed, main is unchanged: run publish again (objects already stored are "
                                     "not sent again)") from err
        say(f"uploaded {min(i + batch_files, len(adds))}/{len(adds)} data files")


def _conflicts(api: Any, repo_id: str, old: str | None, new: str | None, plan: _Plan) -> list[str]:
    """Paths the other writer changed between `old` and `new` that `plan` (made against `new`) would
    overwrite or delete: retrying on `new` is safe only when this is empty."""
    before, after = _tree(api, repo_id, old), _tree(api, repo_id, new)
    changed = {p for p in set(before) | set(after)
               if (p in before) != (p in after) or (p in before and _content_id(before[p]) != _content_id(after[p]))}
    return sorted(changed & plan.writes)


def _commit(api: Any, repo_id: str, build_id: str, plan: _Plan, card_bytes: bytes, configs: list[str]) -> Any:
    from huggingface_hub import CommitOperationAdd

    ops = [*plan.adds, CommitOperationAdd(path_in_repo="README.md", path_or_fileobj=card_bytes), *plan.deletes]
    return api.create_commit(
        repo_id, ops, repo_type="dataset", revision=BRANCH, parent_commit=plan.parent,
        commit_message=f"trajforge build {build_id}",
        commit_description=f"configs: {', '.join(configs)}; {len(plan.adds)} files added, {len(plan.deletes)} deleted")


def _check_retry(repo_id: str, build_id: str, parent: str | None, moved_to: str | None, clash: list[str],
                 attempt: int, attempts: int, say: Any) -> None:
    """After a 412: ConcurrentChangeError when the other writer changed paths this commit would overwrite
    (`clash`) or no attempt is left; else say that the commit is retried on `moved_to`."""
    where = (f"{repo_id}: main moved from {(parent or '?')[:12]} to {(moved_to or '?')[:12]} while publishing "
             f"{build_id} (someone else committed)")
    if clash:
        raise ConcurrentChangeError(
            f"{where}, changing {', '.join(clash[:5])}{' …' if len(clash) > 5 else ''}, which this publish would "
            "overwrite: nothing was committed. Look at what they published, then run publish again to publish on "
            "top of it")
    if attempt >= attempts:
        raise ConcurrentChangeError(f"{where}, {attempts} times: nothing was committed; run publish again")
    say(f"{where}; their change touches nothing this publish writes: re-planned on {(moved_to or '?')[:12]}, "
        f"retrying (commit attempt {attempt + 1}/{attempts})")


def _is_moved(err: Exception) -> bool:
    return getattr(getattr(err, "response", None), "status_code", None) == 412


def _already_published(api: Any, store: RunStore, build_id: str, repo_id: str, tags: dict[str, str],
                       head: str | None, configs: list[str], private: bool, say: Any) -> dict[str, Any]:
    """The record of a build whose tag exists (recorded now when the run that tagged it died first)."""
    record_path, history = _history(store, build_id)
    say(f"build {build_id} is already published to {repo_id} (tag {build_id} = {tags[build_id][:12]}); "
        + ("it is the head of main" if head == tags[build_id] else f"main is at {(head or '?')[:12]}")
        + ": nothing to do")
    previous = next((r for r in reversed(history) if r.get("repo_id") == repo_id and r.get("revision")), None)
    if previous is None:  # the run that tagged it died before recording it: record what the tag holds
        files = [{"path": p, "size": f.size} for p, f in _tree(api, repo_id, tags[build_id]).items()
                 if p != ".gitattributes"]
        previous = {"repo_id": repo_id, "build_id": build_id, "revision": tags[build_id],
                    "commit": tags[build_id], "url": None, "tag": build_id, "configs": configs,
                    "private": private, "status": "unchanged", "endpoint": getattr(api, "endpoint", None),
                    "files": sorted(files, key=lambda f: f["path"]),
                    "at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
        store.write_json(record_path, [*history, previous])
    return {**previous, "status": "unchanged"}


def _card(api: Any, repo_id: str, card: str, header: dict[str, Any], tags: dict[str, str], build_id: str,
          tag: bool, base: dict[str, Any] | None) -> tuple[bytes, list[str]]:
    """The card to commit and its configs: the build's card, its "How to load" naming the repo and the
    newest tags; when appending (`base`: the published card's header), its configs' data_files also
    name the published shards."""
    from .publish_append import merged_configs, with_configs

    configs = header.get("configs", []) if base is None else merged_configs(base, header)
    revisions = sorted(t for t in tags if t != build_id) + ([build_id] if tag else [])
    text = hub_usage(card if base is None else with_configs(card, configs), repo_id, revisions[-10:])
    return text.encode(), [c["config_name"] for c in configs]


def _append_base(api: Any, repo_id: str, tags: dict[str, str], head: str | None,
                 say: Any) -> tuple[str | None, str | None, dict[str, Any] | None]:
    """(parent build id, its commit, its card's header) for `--append`; (None, head, None) when main
    holds no published build (the append is then a first publish, and says so)."""
    from .publish_append import fetch, parent_build

    found = parent_build(api, repo_id, BRANCH, tags)
    if found is None:
        say(f"{repo_id}: main holds no published build: --append publishes this build as the first one")
        return None, head, None
    build, commit = found
    card = fetch(api, repo_id, "README.md", commit).decode()
    try:
        return build, commit, validate_card(card)
    except CardError as err:
        raise PublishError(f"{repo_id}: the card of published build {build} ({commit[:12]}): {err}") from None


def publish(store: RunStore, build_id: str, repo_id: str, *, private: bool = False, token: str | None = None,
            tag: bool = True, api: Any = None, endpoint: str | None = None, batch_files: int = 100,
            say: Any = None, append: bool = False, attempts: int = 3,
            environments: str | None = None) -> dict[str, Any]:
    """Publish the build's dataset folder to `repo_id` (created if missing) in one commit on `main`,
    tagged with the build id; returns the record appended to `<build>/published.json` (`status`:
    `published`, `tagged` = the branch already held it, or `unchanged` = already published).
    `api` defaults to `huggingface_hub.HfApi(endpoint=endpoint)`; `batch_files` data files are
    pre-uploaded per request; `say(str)` receives progress lines.

    `append`: add the build's shards to the last published build's (its tag is the commit's parent;
    nothing deleted; the card's data_files name both), refused with SchemaChangeError when a config's
    schema differs. When `main` moves under the commit (412), the commit is re-planned on the new head
    and retried, up to `attempts` commits in all, unless the other writer changed a path this commit
    writes or deletes (ConcurrentChangeError: nothing is overwritten blindly).

    `environments` (`none`, `rl`, `kept`) adds the build's environments as a Harbor task tree under
    `tasks/` in the same commit, declared in the card (tasks/dataset/env_tree.py); a tree of an earlier
    build is deleted in that commit. Not with `append` (the tree's manifest describes one build)."""
    with tempfile.TemporaryDirectory(prefix="trajforge-publish-") as tmp:  # the tree and copied shards
        return _publish(store, build_id, repo_id, tmp, private=private, token=token, tag=tag, api=api,
                        endpoint=endpoint, batch_files=batch_files, say=say, append=append, attempts=attempts,
                        environments=environments)


def _publish(store: RunStore, build_id: str, repo_id: str, tmp: str, *, private: bool, token: str | None,
             tag: bool, api: Any, endpoint: str | None, batch_files: int, say: Any, append: bool, attempts: int,
             environments: str | None) -> dict[str, Any]:
    """`publish`, with `tmp` a scratch folder it may fill."""
    from huggingface_hub.errors import HfHubHTTPError

    say = say or (lambda _msg: None)
    folder = dataset_folder(store, build_id)
    require_secrets_scan(store, folder)
    card = store.fs.cat(posixpath.join(folder, "README.md")).decode()
    try:
        header = validate_card(card)
    except CardError as err:
        raise PublishError(f"build {build_id}: {err}") from None
    if not header.get("configs"):
        raise PublishError(f"build {build_id}: the dataset card declares no config (every config is empty)")
    if append and (environments or "none") != "none":
        raise PublishError(f"build {build_id}: --append cannot publish environments (--environments "
                           f"{environments}): the tree's manifest describes one build; append without it, or "
                           "publish the build in full with its environments")
    try:  # before anything is sent: an environment that cannot be exported publishes nothing
        tree = environment_tree(store, build_id, environments, Path(tmp) / "tree")
    except EnvTreeError as err:
        raise PublishError(f"build {build_id}: {err}") from None
    card = tree.declare(card, repo_id)
    if api is None:
        from huggingface_hub import HfApi

        api = HfApi(endpoint=endpoint or None, token=token or os.environ.get("HF_TOKEN"))
    api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=True)
    tags, head = _refs(api, repo_id)
    if tag and build_id in tags:
        return _already_published(api, store, build_id, repo_id, tags, head,
                                  [c["config_name"] for c in header["configs"]], private, say)
    parent_build, parent, base = _append_base(api, repo_id, tags, head, say) if append else (None, head, None)
    files = _data_files(store, folder, header)
    local = _localize(store, files, tree, tmp)
    if base is not None:
        from .publish_append import check_schemas

        check_schemas(api, repo_id, parent, base, sorted(_tree(api, repo_id, parent)), header,
                      {rel: f.path for rel, f in local.items()})
        say(f"appending to build {parent_build} ({parent[:12]}): every config keeps its published schema")
        from .publish_append import append_note

        card = append_note(card, build_id, parent_build)
    ops: dict[str, Any] = {}
    card_bytes, configs = _card(api, repo_id, card, header, tags, build_id, tag, base)
    plan = _plan(api, repo_id, parent, local, card_bytes, append, ops, tree)
    for attempt in range(1, attempts + 1):
        if not (plan.adds or plan.deletes or plan.card_changed):
            revision, url, status = parent, None, "tagged" if tag else "unchanged"
            say(f"main already holds build {build_id} ({(parent or '?')[:12]})"
                + (": tagging only" if tag else ": nothing to do"))
            break
        _upload(api, repo_id, plan.adds, batch_files, say)
        try:
            commit = _commit(api, repo_id, build_id, plan, card_bytes, configs)
        except HfHubHTTPError as err:
            if not _is_moved(err):
                raise
            tags, moved_to = _refs(api, repo_id)
            if tag and build_id in tags:  # another run published this very build meanwhile
                return _already_published(api, store, build_id, repo_id, tags, moved_to, configs, private, say)
            card_bytes, configs = _card(api, repo_id, card, header, tags, build_id, tag, base)
            replan = _plan(api, repo_id, moved_to, local, card_bytes, append, ops, tree)
            _check_retry(repo_id, build_id, parent, moved_to, _conflicts(api, repo_id, parent, moved_to, replan),
                         attempt, attempts, say)
            parent, plan = moved_to, replan  # the next attempt commits the plan made on the new head
            continue
        revision, url, status = commit.oid, getattr(commit, "commit_url", None), "published"
        say(f"committed {len(plan.adds)} files (+ card), deleted {len(plan.deletes)} on main: {revision[:12]}")
        break
    sizes = {rel: f.size for rel, f in local.items()} | {"README.md": len(card_bytes)}
    if tag:
        api.create_tag(repo_id, tag=build_id, repo_type="dataset", revision=revision, exist_ok=True)
    record_path, history = _history(store, build_id)
    record = {"repo_id": repo_id, "build_id": build_id, "revision": revision, "commit": revision, "url": url,
              "tag": build_id if tag else None, "configs": configs, "private": private, "status": status,
              "endpoint": getattr(api, "endpoint", None), "appended_to": parent_build,
              "files": [{"path": p, "size": s} for p, s in sorted(sizes.items())],
              "at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    store.write_json(record_path, [*history, record])
    return record
