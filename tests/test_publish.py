"""Publishing with the real huggingface_hub client against the loopback Hub (tests/hub_server.py),
read back with `datasets.load_dataset("<org>/<name>", config, revision=<build id>)` through
`HF_ENDPOINT`; the dataset card's metadata checked with huggingface_hub's card tools."""

from __future__ import annotations

import json
import os
import posixpath
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import small_config, venv_bin

from trajforge.flows.publish import (
    ConcurrentChangeError,
    PublishError,
    UploadRefusedError,
    publish,
    require_secrets_scan,
)
from trajforge.flows.publish_append import SchemaChangeError
from trajforge.schemas.config import ExportConfig, parse_config
from trajforge.tasks.dataset.card import CardError, hub_usage, validate_card
from trajforge.tasks.engine.store import RunStore

CARD = """---
license: {license}
size_categories:
- n<1K
configs:
- config_name: sft
  data_files:
  - split: train
    path: sft/train-abc-*.parquet
---

# t

## How to load

OLD-USAGE

## Provenance

p
"""


# -- pure logic (no Docker) ------------------------------------------------------------------------------

def test_card_config_takes_only_hub_vocabulary_and_other_needs_name_and_link():
    assert ExportConfig().card.license == "unknown"
    with pytest.raises(ValueError, match="license_name and export.card.license_link"):
        ExportConfig(card={"license": "other"})
    with pytest.raises(ValueError, match="not a Hub license id"):
        ExportConfig(card={"license": "Apache 2"})
    with pytest.raises(ValueError, match="not Hub task categories"):
        ExportConfig(card={"task_categories": ["agents"]})
    ok = ExportConfig(card={"license": "other", "license_name": "acme-data", "license_link": "LICENSE.md"})
    assert ok.card.license_name == "acme-data"


def test_validate_card_refuses_what_the_hub_refuses_and_hub_usage_names_repo_and_revisions():
    with pytest.raises(CardError, match="license"):
        validate_card(CARD.format(license="apache"))
    with pytest.raises(CardError, match="license_name"):
        validate_card(CARD.format(license="other"))
    card = hub_usage(CARD.format(license="mit"), "org/trajs", ["b1", "b2"])
    assert 'load_dataset("org/trajs", "sft", split="train")' in card
    assert 'revision="b1"' in card and 'revision="b2"' in card and "OLD-USAGE" not in card
    assert card.index("## How to load") < card.index("## Provenance")  # replaced in place


def test_publish_refuses_an_export_that_was_not_scanned_for_secrets(tmp_path):
    store = RunStore(str(tmp_path / "runs"), "d")
    store.write_json(str(tmp_path / "runs/d/x/export/fp/stats.json"), {"configs": {"sft": 1}})
    with pytest.raises(PublishError, match="not scanned for secrets"):
        require_secrets_scan(store, str(tmp_path / "runs/d/x/export/fp"))
    store.write_json(str(tmp_path / "runs/d/x/export/fp/stats.json"), {"secrets": {"action": "redact"}})
    assert require_secrets_scan(store, str(tmp_path / "runs/d/x/export/fp"))["action"] == "redact"


def test_hub_server_commits_are_atomic_and_guarded_by_the_parent(hub_server, tmp_path):
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi
    from huggingface_hub.errors import HfHubHTTPError

    api = HfApi(endpoint=hub_server.endpoint, token="hf_test")
    api.create_repo("org/atomic", repo_type="dataset")
    head = hub_server.head("org/atomic")
    first = api.create_commit("org/atomic", [CommitOperationAdd("a/x.parquet", b"1")], commit_message="one",
                              repo_type="dataset", parent_commit=head)
    with pytest.raises(HfHubHTTPError):  # deleting a missing file fails the whole commit: `b` is not added
        api.create_commit("org/atomic", [CommitOperationAdd("b.txt", b"2"), CommitOperationDelete("nope.txt")],
                          commit_message="two", repo_type="dataset")
    with pytest.raises(HfHubHTTPError, match="412"):  # a stale parent is refused
        api.create_commit("org/atomic", [CommitOperationAdd("c.txt", b"3")], commit_message="three",
                          repo_type="dataset", parent_commit=head)
    assert hub_server.head("org/atomic") == first.oid and set(hub_server.files("org/atomic")) == {
        ".gitattributes", "a/x.parquet"}
    api.create_tag("org/atomic", tag="v1", repo_type="dataset", revision=first.oid)
    with pytest.raises(HfHubHTTPError, match="409"):
        api.create_tag("org/atomic", tag="v1", repo_type="dataset")
    assert [f.path for f in api.list_repo_tree("org/atomic", repo_type="dataset", revision="v1", recursive=True)
            if hasattr(f, "blob_id")] == [".gitattributes", "a/x.parquet"]


# -- the LFS path, retries on a moved parent, append: builds written directly (no Docker) ------------------

def _fake_build(store: RunStore, build_id: str, fp: str, configs: tuple[str, ...] = ("sft", "trajectories"),
                shards: int = 2, rows: int = 3, extra_column: bool = False, payload: int = 600) -> dict[str, bytes]:
    """A committed build whose export holds `shards` Parquet files per config (`<config>/train-<fp>-NNNNN.parquet`,
    `payload` random bytes per row), a valid card declaring them and a secrets scan; returns repo path -> bytes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from trajforge.schemas.build import BuildRecord, StageEntry

    export = store.stage_dir(build_id, "export", fp)
    out = {}
    for cfg in configs:
        for k in range(shards):
            cols = {"rollout_id": [f"{build_id}-{cfg}-{k}-{i}" for i in range(rows)],
                    "blob": [os.urandom(payload) for _ in range(rows)]}
            if extra_column:
                cols["score"] = [0.5] * rows
            path = posixpath.join(export, cfg, f"train-{fp}-{k:05d}.parquet")
            os.makedirs(posixpath.dirname(path), exist_ok=True)
            pq.write_table(pa.table(cols), path)
            out[posixpath.relpath(path, export)] = Path(path).read_bytes()
    header = "".join(f"- config_name: {c}\n  data_files:\n  - split: train\n    path: {c}/train-{fp}-*.parquet\n"
                     for c in configs)
    card = CARD.format(license="mit").replace(CARD.split("configs:\n")[1].split("---")[0], header)
    store.write_text(posixpath.join(export, "README.md"), card)
    store.write_json(posixpath.join(export, "manifest.json"), {"stage": "export"})
    store.write_json(posixpath.join(export, "stats.json"), {"secrets": {"action": "redact", "found": 0}})
    store.write_build(BuildRecord(build_id=build_id, dataset=store.dataset, created_at="2026-01-01T00:00:00Z",
                                  status="committed", stages={"export": StageEntry(
                                      fingerprint=fp, components={}, status="committed", manifest=export)}))
    return out


def _sha(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def _kill_when_stalled(hub_server, route: str, cmd: list[str]) -> dict[str, str]:
    """Run the publish command `cmd` in a process, stall the Hub at `route` and SIGKILL the publisher
    there; returns the process environment it ran with (Prefect's API left out), for the re-run."""
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    hub_server.stall(route)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert hub_server.stalled.wait(120), f"the publisher never reached {route}: {proc.poll()}"
        proc.kill()
        proc.wait(30)
    finally:
        hub_server.release()
    return env


def _api(hub_server):
    from huggingface_hub import HfApi

    return HfApi(endpoint=hub_server.endpoint, token="hf_test")


def test_publish_takes_the_lfs_path_and_a_rerun_after_a_refused_upload_sends_no_stored_object(hub_server, tmp_path):
    """Parquet goes to LFS (the repo's `.gitattributes`): preupload says "lfs", the batch API hands out
    upload + verify hrefs, the commit references pointers. The Hub refuses the 3rd object's upload: a named
    error, nothing committed; the re-run sends only the objects storage does not hold yet."""
    store = RunStore(str(tmp_path / "runs"), "lfs")
    data = _fake_build(store, "b1", "fp1", shards=3)
    repo, api = "org/lfs", _api(hub_server)
    puts0 = len(hub_server.lfs_puts)
    hub_server.fail("lfs-upload", after=2)
    with pytest.raises(UploadRefusedError, match="(?s)refused uploading .*injected failure of lfs-upload"):
        publish(store, "b1", repo, api=api, batch_files=2)
    assert set(hub_server.files(repo)) == {".gitattributes"}, "nothing committed"
    assert not api.list_repo_refs(repo, repo_type="dataset").tags
    assert not store.exists(posixpath.join(store.build_dir("b1"), "published.json"))
    stored = hub_server.objects(repo)
    assert 2 <= len(stored) < len(data) and stored <= {_sha(b) for b in data.values()}

    puts1 = len(hub_server.lfs_puts)
    rec = publish(store, "b1", repo, api=api, batch_files=2)
    assert rec["status"] == "published" and hub_server.head(repo, "b1") == rec["revision"]
    resent = set(hub_server.lfs_puts[puts1:])
    assert not resent & stored, "an object storage already held was sent again"
    assert resent | stored == {_sha(b) for b in data.values()}
    assert len(hub_server.lfs_puts) - puts0 == len(data) + 1, "each object sent once, plus the refused attempt"
    assert hub_server.lfs_files(repo) == {p: _sha(b) for p, b in data.items()}, "every Parquet file is an LFS pointer"
    files = hub_server.files(repo)
    assert all(files[p] == b for p, b in data.items())
    verify = [p for m, p in hub_server.requests if m == "POST" and p.endswith("/verify")]
    assert len(verify) >= len(data) and any(p.endswith(".git/info/lfs/objects/batch") for _, p in hub_server.requests)
    tree = {f.path: f for f in api.list_repo_tree(repo, repo_type="dataset", recursive=True) if hasattr(f, "blob_id")}
    assert all(tree[p].lfs.sha256 == _sha(b) and tree[p].lfs.size == len(b) for p, b in data.items())
    assert tree["README.md"].lfs is None


def test_a_publish_killed_mid_upload_resumes_without_resending_stored_objects(hub_server, tmp_path):
    """`trajforge publish` killed (SIGKILL) while the Hub holds its LFS uploads: nothing is committed; the
    re-run sends only the objects storage does not hold (the batch API answers "held" for the others)."""
    store = RunStore(str(tmp_path / "runs"), "kill")
    data = _fake_build(store, "b1", "fpk", shards=4)
    repo = "org/killed-upload"
    cmd = [venv_bin("trajforge"), "publish", repo, "--build", "b1", "--runs", store.runs_url, "--dataset", "kill",
           "--endpoint", hub_server.endpoint, "--token", "hf_test"]
    env = _kill_when_stalled(hub_server, "lfs-upload", cmd)
    assert hub_server.wait_idle(60)
    assert set(hub_server.files(repo)) == {".gitattributes"} and not hub_server.lfs_files(repo), "nothing committed"
    stored = hub_server.objects(repo)
    assert set() < stored < {_sha(b) for b in data.values()}, "killed with some objects stored, not all"
    puts = len(hub_server.lfs_puts)
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    resent = hub_server.lfs_puts[puts:]
    assert not set(resent) & stored and len(resent) == len(set(resent))
    assert set(resent) | stored == {_sha(b) for b in data.values()}
    assert hub_server.lfs_files(repo, "b1") == {p: _sha(b) for p, b in data.items()}


def test_large_objects_go_up_in_parts_and_load_back(hub_server, tmp_path):
    """An object over the Hub's multipart threshold: the client PUTs each part, then completes it; what
    `hf_hub_download` serves back is the file."""
    from huggingface_hub import hf_hub_download

    store = RunStore(str(tmp_path / "runs"), "mp")
    data = _fake_build(store, "b1", "fpm", configs=("sft",), shards=1, rows=4, payload=3000)
    size = len(data["sft/train-fpm-00000.parquet"])
    saved = hub_server.multipart_threshold, hub_server.chunk_size
    hub_server.multipart_threshold, hub_server.chunk_size = 4096, 4096
    try:
        puts0 = len(hub_server.lfs_puts)
        publish(store, "b1", "org/multipart", api=_api(hub_server))
    finally:
        hub_server.multipart_threshold, hub_server.chunk_size = saved
    assert len(hub_server.lfs_puts) - puts0 == -(-size // 4096) > 1
    got = hf_hub_download("org/multipart", "sft/train-fpm-00000.parquet", repo_type="dataset", revision="b1",
                          endpoint=hub_server.endpoint, token="hf_test", cache_dir=tmp_path / "cache")
    assert Path(got).read_bytes() == data["sft/train-fpm-00000.parquet"]


def _racing_api(hub_server, intruder):
    """An HfApi whose first create_commit lets `intruder(api)` commit on main first (another writer)."""
    from huggingface_hub import HfApi

    class Racing(HfApi):
        raced = False

        def create_commit(self, *args, **kwargs):
            if not Racing.raced:
                Racing.raced = True
                intruder(_api(hub_server))
            return super().create_commit(*args, **kwargs)

    return Racing(endpoint=hub_server.endpoint, token="hf_test")


def test_a_commit_whose_parent_moved_says_so_and_retries_on_the_new_head(hub_server, tmp_path):
    """Another writer adds a file the publish does not touch between planning and commit: the Hub refuses
    the stale parent (412), the publish says so, re-plans on the new head and commits there; the other
    writer's file stays and build 1's data files are still replaced."""
    from huggingface_hub import CommitOperationAdd

    store = RunStore(str(tmp_path / "runs"), "race")
    _fake_build(store, "b1", "fp1")
    data2 = _fake_build(store, "b2", "fp2")
    repo = "org/race"
    rec1 = publish(store, "b1", repo, api=_api(hub_server))
    other = []
    api = _racing_api(hub_server, lambda a: other.append(a.create_commit(
        repo, [CommitOperationAdd("LICENSE.md", b"mine")], commit_message="license", repo_type="dataset")))
    lines: list[str] = []
    rec2 = publish(store, "b2", repo, api=api, say=lines.append)
    assert any("main moved from" in line and "retrying (commit attempt 2/3)" in line for line in lines), lines
    history = hub_server.history(repo)
    assert [h["id"] for h in history[:3]] == [rec2["revision"], other[0].oid, rec1["revision"]]
    assert hub_server.commit_parents[-2:] == [rec1["revision"], other[0].oid]
    files = hub_server.files(repo)
    assert files["LICENSE.md"] == b"mine", "the other writer's file is kept"
    assert {p for p in files if p.endswith(".parquet")} == set(data2)
    assert hub_server.head(repo, "b2") == rec2["revision"]


@pytest.mark.parametrize("change", ["card", "newer build"])
def test_a_commit_whose_parent_moved_is_not_retried_over_what_the_other_writer_published(hub_server, tmp_path,
                                                                                        change):
    """The other writer edited the card, or published another build's data: retrying would overwrite or
    delete their files, so the publish stops with ConcurrentChangeError naming them; nothing committed."""
    from huggingface_hub import CommitOperationAdd

    store = RunStore(str(tmp_path / "runs"), "clash")
    _fake_build(store, "b1", "fp1")
    _fake_build(store, "b2", "fp2")
    repo = f"org/clash-{change.replace(' ', '-')}"
    publish(store, "b1", repo, api=_api(hub_server))
    path = "README.md" if change == "card" else "sft/train-other-00000.parquet"
    api = _racing_api(hub_server, lambda a: a.create_commit(
        repo, [CommitOperationAdd(path, b"their content")], commit_message="theirs", repo_type="dataset"))
    head = None
    with pytest.raises(ConcurrentChangeError, match=f"main moved .*changing {path}.*nothing was committed"):
        head = publish(store, "b2", repo, api=api)
    assert head is None and hub_server.history(repo)[0]["title"] == "theirs"
    assert hub_server.files(repo)[path] == b"their content"
    assert "b2" not in {t.name for t in api.list_repo_refs(repo, repo_type="dataset").tags}
    assert not store.exists(posixpath.join(store.build_dir("b2"), "published.json"))


def test_append_publishes_only_new_shards_pinned_to_the_parent_build_and_refuses_a_schema_change(hub_server,
                                                                                                 tmp_path):
    """`publish --append`: build 2's shards are added next to build 1's (nothing deleted), the commit's parent
    is build 1's tag, the card's data_files name both builds and `datasets` loads both; build 3, whose `sft`
    gained a column, is refused by name before anything is uploaded or committed."""
    from huggingface_hub import DatasetCard
    from typer.testing import CliRunner

    from trajforge.flows.cli import app

    store = RunStore(str(tmp_path / "runs"), "app")
    data1 = _fake_build(store, "b1", "fp1")
    data2 = _fake_build(store, "b2", "fp2")
    _fake_build(store, "b3", "fp3", extra_column=True)
    repo, api = "org/append", _api(hub_server)
    rec1 = publish(store, "b1", repo, api=api)
    puts = len(hub_server.lfs_puts)
    args = ["publish", repo, "--runs", str(tmp_path / "runs"), "--dataset", "app", "--endpoint", hub_server.endpoint,
            "--token", "hf_test", "--append"]
    res = CliRunner().invoke(app, [*args, "--build", "b2"])
    assert res.exit_code == 0, res.output
    assert "appending to build b1" in res.output
    rec2 = store.read_json(posixpath.join(store.build_dir("b2"), "published.json"))[-1]
    assert rec2["appended_to"] == "b1" and rec2["tag"] == "b2" and hub_server.head(repo, "b2") == rec2["revision"]
    assert hub_server.commit_parents[-1] == rec1["revision"], "pinned to the parent build's revision"
    assert sorted(hub_server.lfs_puts[puts:]) == sorted(_sha(b) for b in data2.values()), "only the new shards"
    files = hub_server.files(repo)
    assert {p for p in files if p.endswith(".parquet")} == set(data1) | set(data2)
    card = DatasetCard(files["README.md"].decode())
    paths = {c["config_name"]: c["data_files"][0]["path"] for c in card.data.configs}
    assert paths == {c: [f"{c}/train-fp1-*.parquet", f"{c}/train-fp2-*.parquet"] for c in ("sft", "trajectories")}
    assert "This revision adds build `b2` to the builds published before it (the last: `b1`)" in card.text
    got = _load_through_endpoint(hub_server.endpoint, tmp_path / "hf", repo, [("sft", None), ("sft", "b1")])
    assert len(got[0]) == 2 * len(got[1]) == 12 and set(got[1]) < set(got[0]), "main: both builds' rows"

    head, puts, preuploads = hub_server.head(repo), len(hub_server.lfs_puts), len(hub_server.requests)
    res = CliRunner().invoke(app, [*args, "--build", "b3"])
    assert res.exit_code == 1
    assert "schema differs" in res.output and "'sft'" in res.output and "score: added (double)" in res.output
    with pytest.raises(SchemaChangeError, match="config 'trajectories': score: added"):
        publish(store, "b3", repo, api=api, append=True)
    assert hub_server.head(repo) == head and len(hub_server.lfs_puts) == puts
    assert not [p for _, p in hub_server.requests[preuploads:] if "/preupload/" in p or p.endswith("/commit/main")]
    assert "b3" not in {t.name for t in api.list_repo_refs(repo, repo_type="dataset").tags}

def test_append_with_environments_is_refused_before_anything_is_sent(hub_server, tmp_path):
    """An appended revision spans several builds, a task tree's manifest describes one: refused by name,
    before the repository is even created."""
    store = RunStore(str(tmp_path / "runs"), "app")
    _fake_build(store, "b1", "fp1")
    api, before = _api(hub_server), len(hub_server.requests)
    with pytest.raises(PublishError, match="--append cannot publish environments"):
        publish(store, "b1", "org/nothing", api=api, append=True, environments="rl")
    assert len(hub_server.requests) == before, "nothing reached the Hub"



# -- two real replay builds, published and read back ------------------------------------------------------

@pytest.fixture(scope="module")
def two_builds(tmp_path_factory, prefect_api):
    """Build 1 (2 environments x 2 samples) and build 2 (x 1 sample: other files and rows, propose and synthesize reused)."""
    from trajforge.flows.launch import run_build

    runs = tmp_path_factory.mktemp("runs")
    cfg1 = parse_config(small_config(runs, dataset="pub"))
    b1 = run_build(cfg1)["build_id"]
    b2 = run_build(parse_config(small_config(runs, dataset="pub", **{"rollout.samples_per_env": 1})))["build_id"]
    return RunStore(cfg1.runs, cfg1.dataset), b1, b2


def _local_ids(store: RunStore, build_id: str, config: str) -> list[str]:
    import pyarrow.parquet as pq

    folder = store.read_build(build_id).committed("export")
    files = sorted(store.fs.glob(posixpath.join(folder, config, "*.parquet")))
    return sorted(r for f in files for r in pq.read_table(f, columns=["rollout_id"]).column(0).to_pylist())


def _records(store: RunStore, build_id: str) -> list[dict]:
    path = posixpath.join(store.build_dir(build_id), "published.json")
    return store.read_json(path) if store.exists(path) else []


def _load_through_endpoint(endpoint: str, home: Path, repo: str, loads: list[tuple[str, str | None]]) -> list:
    """`datasets.load_dataset(repo, config, revision=...)` in a fresh interpreter whose HF_ENDPOINT
    is the loopback Hub (the way a user points datasets at a Hub mirror)."""
    code = ("import datasets, json, sys\nout = []\n"
            "for config, rev in json.loads(sys.argv[1]):\n"
            "    ds = datasets.load_dataset(sys.argv[2], config, revision=rev, split='train')\n"
            "    out.append(sorted(ds['rollout_id']))\n"
            "print(json.dumps(out))\n")
    env = {**os.environ, "HF_ENDPOINT": endpoint, "HF_HOME": str(home), "HF_TOKEN": "hf_test",
           "HF_HUB_DISABLE_TELEMETRY": "1"}
    out = subprocess.run([sys.executable, "-c", code, json.dumps(loads), repo], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.docker
@pytest.mark.slow
def test_publish_two_builds_atomically_and_each_tag_loads_its_own_rows(two_builds, hub_server, tmp_path):
    from huggingface_hub import DatasetCard, HfApi

    store, b1, b2 = two_builds
    repo = "org/trajs"
    api = HfApi(endpoint=hub_server.endpoint, token="hf_test")
    lines: list[str] = []

    rec1 = publish(store, b1, repo, api=api, say=lines.append)
    assert rec1["status"] == "published" and rec1["tag"] == b1 and hub_server.head(repo) == rec1["revision"]
    assert hub_server.head(repo, b1) == rec1["revision"]
    again = publish(store, b1, repo, api=api, say=lines.append)  # re-publishing the same build: a no-op
    assert again["status"] == "unchanged" and "already published" in lines[-1]
    assert hub_server.head(repo) == rec1["revision"]

    # build 2, interrupted after its first pre-upload batch: main stays at build 1, no tag, no record
    hub_server.fail("preupload", after=1)
    with pytest.raises(Exception, match="injected failure"):
        publish(store, b2, repo, api=api, batch_files=1)
    assert hub_server.head(repo) == rec1["revision"]
    assert b2 not in {t.name for t in api.list_repo_refs(repo, repo_type="dataset").tags}
    # (this repo only: the module's builds are shared, and another test may have published build 2 elsewhere)
    assert not [r for r in _records(store, b2) if r["repo_id"] == repo]

    rec2 = publish(store, b2, repo, api=api, batch_files=1)  # the re-run completes it, in one commit
    history = hub_server.history(repo)
    assert history[0]["id"] == rec2["revision"] and history[1]["id"] == rec1["revision"]
    assert history[0]["title"] == f"trajforge build {b2}"
    files = hub_server.files(repo)
    data1 = {p for p in hub_server.files(repo, b1) if p.endswith(".parquet")}
    assert not data1 & set(files), "build 1's data files are deleted in build 2's commit"
    assert {f["path"] for f in rec2["files"]} == set(files) - {".gitattributes"}
    assert all(len(files[f["path"]]) == f["size"] for f in rec2["files"] if f["path"] != "README.md")
    saved = store.read_json(posixpath.join(store.build_dir(b2), "published.json"))[-1]
    assert saved["revision"] == rec2["revision"] and saved["tag"] == b2

    card = DatasetCard(files["README.md"].decode())
    assert card.data.license == "unknown" and card.data.size_categories == ["n<1K"]
    assert "text-generation" in card.data.task_categories and card.data.pretty_name == "pub"
    assert f'revision="{b1}"' in card.text and f'revision="{b2}"' in card.text
    assert f'load_dataset("{repo}", "sft", split="train")' in card.text and "## Provenance" in card.text

    sft1, sft2 = _local_ids(store, b1, "sft"), _local_ids(store, b2, "sft")
    assert len(sft1) == 4 and len(sft2) == 2
    got = _load_through_endpoint(hub_server.endpoint, tmp_path / "hf", repo,
                                 [("sft", b1), ("sft", b2), ("trajectories", b1), ("sft", None)])
    assert got == [sft1, sft2, _local_ids(store, b1, "trajectories"), sft2]


# Where `trajforge publish` is killed: the Hub holds the request to ROUTE (before it acts, or once it applied it,
# before it answers) until the publisher is dead; then the Hub finishes what it was doing.
KILL_POINTS = {
    "preupload": "while pre-uploading data files",
    "commit": "with the commit sent, before the Hub applied it",
    "commit-applied": "after the Hub applied the commit, before the answer",
    "tag": "with the tag request sent, before the Hub tagged",
    "tag-applied": "after the Hub tagged, before the answer (nothing recorded locally)",
}


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.parametrize("route", list(KILL_POINTS))
def test_a_publish_killed_half_way_leaves_main_at_the_old_or_the_new_build_and_a_rerun_completes(
        two_builds, hub_server, tmp_path, route):
    """`trajforge publish` of build 2 killed (SIGKILL) at each point between upload and record: main is then
    build 1's commit or one complete commit of build 2 (whatever the Hub applied), never a partial one; the
    same command run again completes the publication (one commit for build 2, tagged, recorded once)."""
    from huggingface_hub import HfApi

    store, b1, b2 = two_builds
    repo = f"org/killed-{route}"
    rec1 = publish(store, b1, repo, api=HfApi(endpoint=hub_server.endpoint, token="hf_test"))
    old_files = hub_server.files(repo)
    cmd = [venv_bin("trajforge"), "publish", repo, "--build", b2, "--runs", store.runs_url,
           "--dataset", "pub", "--endpoint", hub_server.endpoint, "--token", "hf_test"]
    env = _kill_when_stalled(hub_server, route, cmd)
    assert hub_server.wait_idle(60), "the Hub finished the request the killed publisher left"
    head = hub_server.head(repo)
    history = hub_server.history(repo)
    if route == "preupload":
        assert head == rec1["revision"]
    if route in ("commit-applied", "tag", "tag-applied"):
        assert head != rec1["revision"]
    assert head == rec1["revision"] or history[1]["id"] == rec1["revision"], "at most one commit after build 1"
    killed_state = hub_server.files(repo)
    assert not [r for r in _records(store, b2) if r["repo_id"] == repo]

    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    final = hub_server.head(repo)
    assert final == hub_server.head(repo, b2) != rec1["revision"]
    assert hub_server.history(repo)[1]["id"] == rec1["revision"], "one commit for build 2"
    # what the killed run left was build 1's files or build 2's, complete (the commit the re-run tagged)
    assert killed_state in (old_files, hub_server.files(repo)), "never a partial commit"
    if head != rec1["revision"]:
        assert final == head, "the re-run tagged the commit the killed run made; it did not commit again"
    records = [r for r in _records(store, b2) if r["repo_id"] == repo]
    assert len(records) == 1 and records[0]["revision"] == final and records[0]["tag"] == b2, records
    assert {f["path"] for f in records[0]["files"]} == set(hub_server.files(repo)) - {".gitattributes"}
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "already published" in out.stdout, out.stdout + out.stderr
    assert len([r for r in _records(store, b2) if r["repo_id"] == repo]) == 1


def test_a_scheduled_build_asks_the_publish_deployment_to_append(monkeypatch, tmp_path):
    """The build deployment's `publish_append` travels on the committed event and becomes the publish run's
    `append` (prefect.yaml's trigger, rendered the way Prefect renders a one-expression template: `| tojson`)."""
    import inspect

    import jinja2
    import yaml

    from trajforge.flows import deployments

    store = RunStore(str(tmp_path / "runs"), "sched")
    _fake_build(store, "b1", "fp1", configs=("sft",), shards=1)
    sent: list[dict] = []
    monkeypatch.setattr("prefect.events.emit_event", lambda event, resource, payload: sent.append(payload))
    for append in (True, False):
        tokens = deployments._publish_to.set("org/sched"), deployments._publish_append.set(append)
        try:
            deployments.emit_committed(store, store.read_build("b1"))
        finally:
            deployments._publish_to.reset(tokens[0])
            deployments._publish_append.reset(tokens[1])
    assert [p["publish_append"] for p in sent] == [True, False] and sent[0]["publish_to"] == "org/sched"
    spec = yaml.safe_load((Path(deployments.ROOT) / "prefect.yaml").read_text())
    trigger = next(d for d in spec["deployments"] if d["name"] == "publish")["triggers"][0]["parameters"]
    render = lambda payload: json.loads(jinja2.Template(  # noqa: E731
        trigger["append"].strip()[:-2] + " | tojson }}").render(event={"payload": payload}))
    assert [render(p) for p in sent] == [True, False] and render({}) is False, "events of older builds: no append"
    assert "append" in inspect.signature(deployments.publish.fn).parameters
    assert "publish_append" in inspect.signature(deployments.build.fn).parameters
