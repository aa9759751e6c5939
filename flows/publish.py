"""`trajforge publish`: a committed build's dataset folder to a Hugging Face Hub dataset repo.

One commit per build (huggingface_hub does the transfer: chunked, resumable, LFS/Xet handled), tagged
with the build id so every published version stays loadable by `revision=<build id>`. Only what the
card declares is uploaded (README.md and the declared configs' Parquet files); data files of earlier
versions are deleted in the same commit (file names carry the export fingerprint, so an old file
would otherwise linger). The publication is recorded in `<build>/published.json`.

Invariants: only a committed build with an export manifest is published; nothing is uploaded when
the card declares no config; the token comes from `--token`, `$HF_TOKEN` or the huggingface_hub login.
"""

from __future__ import annotations

import datetime as dt
import os
import posixpath
import tempfile
from typing import Any

import yaml

from ..tasks.engine.store import RunStore


class PublishError(RuntimeError):
    """The build cannot be published (not committed, no export, nothing declared)."""


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


def declared_configs(card: str) -> list[str]:
    """Config names in the card's YAML header."""
    if not card.startswith("---"):
        return []
    header = yaml.safe_load(card.split("---", 2)[1]) or {}
    return [c["config_name"] for c in header.get("configs", [])]


def publish(store: RunStore, build_id: str, repo_id: str, *, private: bool = False, token: str | None = None,
            tag: bool = True, api: Any = None) -> dict[str, Any]:
    """Upload the build's dataset folder to `repo_id` (created if missing); returns the record
    written to `<build>/published.json`. `api` defaults to `huggingface_hub.HfApi`."""
    folder = dataset_folder(store, build_id)
    card = store.fs.cat(posixpath.join(folder, "README.md")).decode()
    configs = declared_configs(card)
    if not configs:
        raise PublishError(f"build {build_id}: the dataset card declares no config (every config is empty)")
    if api is None:
        from huggingface_hub import HfApi

        api = HfApi(token=token or os.environ.get("HF_TOKEN"))
    patterns = ["README.md", *[f"{c}/*.parquet" for c in configs]]
    with tempfile.TemporaryDirectory(prefix="trajforge-publish-") as tmp:
        local = folder
        if not store.local:  # object store: huggingface_hub uploads from a local folder
            for p in patterns:
                for src in store.fs.glob(posixpath.join(folder, p)):
                    dst = os.path.join(tmp, posixpath.relpath(src, folder))
                    os.makedirs(os.path.dirname(dst), exist_ok=True)
                    store.fs.get(src, dst)
            local = tmp
        api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=True)
        commit = api.upload_folder(repo_id=repo_id, repo_type="dataset", folder_path=local,
                                   allow_patterns=patterns, delete_patterns=["*/*.parquet"],
                                   commit_message=f"trajforge build {build_id}",
                                   commit_description=f"configs: {', '.join(configs)}")
    oid = getattr(commit, "oid", None)
    if tag:
        api.create_tag(repo_id, tag=build_id, repo_type="dataset", revision=oid, exist_ok=True)
    record = {"repo_id": repo_id, "build_id": build_id, "commit": oid, "url": getattr(commit, "commit_url", None),
              "tag": build_id if tag else None, "configs": configs, "private": private,
              "at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    path = posixpath.join(store.build_dir(build_id), "published.json")
    history = store.read_json(path) if store.exists(path) else []
    store.write_json(path, [*history, record])
    return record
