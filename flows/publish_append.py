"""`trajforge publish --append`: what an append needs to know about the published dataset.

An append adds a build's shards next to the ones a published build left on `main` (file names carry
the export fingerprint, so the two builds never share a name) instead of replacing them. It is
allowed only when every config both builds have keeps the published Arrow schema exactly (same
field names, order, types and nullability; schema metadata ignored): readers of a config then read
both builds' files as one table. A config only the new build has is added; a config only the
published dataset has is kept as it is. Anything else raises SchemaChangeError naming the config and
the fields, before anything is uploaded.

The published schema is read from the Hub, not from a local record: the footer of the config's first
published Parquet file, fetched with a ranged GET of `resolve` (its last 64 KiB; a second one only
for a larger footer): no file is downloaded whole.
"""

from __future__ import annotations

import fnmatch
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from .publish import PublishError


class SchemaChangeError(PublishError):
    """`--append` refused: a config's Arrow schema differs from the published one."""


def parent_build(api: Any, repo_id: str, branch: str, tags: dict[str, str]) -> tuple[str, str] | None:
    """(build id, commit) of the newest commit on `branch` that a tag names (the last published build
    the branch still holds), or None when none does."""
    by_commit: dict[str, list[str]] = {}
    for name, commit in tags.items():
        by_commit.setdefault(commit, []).append(name)
    for c in api.list_repo_commits(repo_id, repo_type="dataset", revision=branch):
        if c.commit_id in by_commit:
            return sorted(by_commit[c.commit_id])[-1], c.commit_id
    return None


def fetch(api: Any, repo_id: str, path: str, revision: str, byte_range: str | None = None) -> bytes:
    """The content of `path` at `revision` (a `Range` header value: only those bytes), via `resolve`."""
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import get_session, hf_raise_for_status

    url = hf_hub_url(repo_id, path, repo_type="dataset", revision=revision, endpoint=api.endpoint)
    headers = api._build_hf_headers()
    if byte_range:
        headers["Range"] = byte_range
    resp = get_session().get(url, headers=headers, follow_redirects=True)
    hf_raise_for_status(resp)
    return resp.content


def remote_schema(api: Any, repo_id: str, path: str, revision: str) -> pa.Schema:
    """The Arrow schema in the footer of a published Parquet file (the file's tail only)."""
    tail = fetch(api, repo_id, path, revision, "bytes=-65536")
    if tail[-4:] != b"PAR1":
        raise PublishError(f"{repo_id}@{revision[:12]}: {path} is not a Parquet file (no footer)")
    need = int.from_bytes(tail[-8:-4], "little") + 8
    if len(tail) < need:
        tail = fetch(api, repo_id, path, revision, f"bytes=-{need}")
    return pq.read_metadata(pa.BufferReader(b"PAR1" + tail[-need:])).schema.to_arrow_schema()


def schema_difference(published: pa.Schema, new: pa.Schema) -> list[str]:
    """What differs, one phrase per field (empty: the same schema)."""
    old, cur = {f.name: f for f in published}, {f.name: f for f in new}
    out = [f"{n}: removed" for n in old if n not in cur]
    out += [f"{n}: added ({cur[n].type})" for n in cur if n not in old]
    out += [f"{n}: {old[n].type}{'' if old[n].nullable else ' not null'} -> {cur[n].type}"
            f"{'' if cur[n].nullable else ' not null'}"
            for n in old if n in cur and not old[n].equals(cur[n], check_metadata=False)]
    if not out and published.names != new.names:
        out.append(f"column order: {published.names} -> {new.names}")
    return out


def config_files(header: dict[str, Any], config: str, paths: list[str]) -> list[str]:
    """The paths among `paths` that `config`'s data_files patterns match, sorted."""
    patterns = [p for df in _config(header, config)["data_files"] for p in _paths(df)]
    return sorted(p for p in paths if any(fnmatch.fnmatch(p, pat) for pat in patterns))


def check_schemas(api: Any, repo_id: str, revision: str, published: dict[str, Any], remote_paths: list[str],
                  header: dict[str, Any], local: dict[str, str]) -> None:
    """SchemaChangeError unless every config both cards declare has the same schema here (`local`: repo
    path -> local file) as in its first published file at `revision`."""
    names = {c["config_name"] for c in published.get("configs", [])}
    problems = []
    for cfg in header.get("configs", []):
        name = cfg["config_name"]
        mine, theirs = config_files(header, name, sorted(local)), (
            config_files(published, name, remote_paths) if name in names else [])
        if not mine or not theirs:
            continue
        diff = schema_difference(remote_schema(api, repo_id, theirs[0], revision), pq.read_schema(local[mine[0]]))
        if diff:
            problems.append(f"config {name!r}: " + "; ".join(diff))
    if problems:
        raise SchemaChangeError(f"{repo_id}: --append refused, the schema differs from the published one "
                                f"({revision[:12]}): " + " | ".join(problems) + ". Nothing was uploaded; publish "
                                "without --append to replace the published build")


def merged_configs(published: dict[str, Any], header: dict[str, Any]) -> list[dict[str, Any]]:
    """The card's `configs` for an appended revision: each config's data_files patterns of both cards
    (published ones first), so `load_dataset` reads both builds' shards."""
    out: dict[str, dict[str, Any]] = {}
    for card in (published, header):
        for cfg in card.get("configs", []):
            entry = out.setdefault(cfg["config_name"], {"config_name": cfg["config_name"], "data_files": []})
            for df in cfg["data_files"]:
                split = df.get("split", "train")
                into = next((d for d in entry["data_files"] if d["split"] == split), None)
                if into is None:
                    entry["data_files"].append(into := {"split": split, "path": []})
                into["path"] += [p for p in _paths(df) if p not in into["path"]]
    return list(out.values())


def with_configs(card: str, configs: list[dict[str, Any]]) -> str:
    """`card` with its YAML header's `configs` replaced (the rest of the card as it is)."""
    from huggingface_hub import DatasetCard

    parsed = DatasetCard(card)
    parsed.data.configs = configs
    return str(parsed)


def append_note(card: str, build_id: str, parent_build: str) -> str:
    """`card` saying, under its title, that the revision appends `build_id`: `load_dataset` reads every
    appended build's rows, while the card's counts and tables are this build's alone."""
    note = (f"> **Appended.** This revision adds build `{build_id}` to the builds published before it (the last: "
            f"`{parent_build}`): `load_dataset` reads the rows of all of them, while the counts and tables below "
            f"describe build `{build_id}` alone (each build's own card: `revision=\"<build id>\"`).\n\n")
    at = card.find("\n# ")
    if at < 0:  # no title: the note opens the body (after the YAML header)
        at = card.find("\n---\n", 3) + 4 if card.startswith("---") else 0
        return card[:at] + "\n" + note + card[at:].lstrip("\n")
    end = card.index("\n", at + 1) + 1
    return card[:end] + "\n" + note + card[end:].lstrip("\n")


def _config(header: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in header.get("configs", []) if c["config_name"] == name)


def _paths(data_files: dict[str, Any]) -> list[str]:
    p = data_files["path"]
    return [p] if isinstance(p, str) else list(p)
