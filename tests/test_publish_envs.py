"""Environments as a Hub artifact: `trajforge publish --environments` adds the build's environments as a
Harbor task tree (`tasks/<name>/` + `tasks/manifest.json`) in the same commit as the data; a snapshot of
the repository imports back (`trajforge envs import`) to the build's env ids."""

from __future__ import annotations

import json
import os
import posixpath
import re
import shutil

import pytest
from helpers import small_config

from trajforge.flows.publish import PublishError, publish
from trajforge.schemas.config import parse_config
from trajforge.schemas.environment import EnvSpec
from trajforge.tasks.dataset.env_tree import HEADING, MANIFEST, EnvTreeError, check_tree, environment_tree, write_tree
from trajforge.tasks.engine.store import RunStore
from trajforge.tasks.envs.families import get_family
from trajforge.tasks.envs.formats import export_harbor, find_tasks, import_task

# -- pure logic (no Docker) ------------------------------------------------------------------------------


def test_a_harbor_export_imports_back_to_its_env_id_unless_edited(tmp_path):
    env = get_family("log_report").generate(1, 0)
    folder = export_harbor(env, tmp_path / "a")
    assert import_task(folder).env_id == env.env_id
    bare = export_harbor(env.model_copy(update={"solution": [], "oracle": "absent"}), tmp_path / "b")
    back = import_task(bare)
    assert back.env_id == env.env_id and back.oracle == "absent" and not (bare / "solution").exists()
    (folder / "tests" / "extra.txt").write_text("x\n")  # an edited folder is another environment
    assert import_task(folder).env_id.startswith(f"harbor-{env.env_id}-")
    toml = (bare / "task.toml").read_text().replace("timeout_sec = 600.0", "timeout_sec = 60.0")
    (bare / "task.toml").write_text(toml)  # task.toml counts too (except the digest itself)
    assert import_task(bare).env_id != env.env_id



def test_a_forged_folder_never_takes_the_env_id_it_records(tmp_path):
    """The attacker's move: export an environment, weaken its hidden test, keep every recorded field. Import
    believes a record only when regenerating the environment gives exactly the folder: the forgery gets an
    id of its own content, the genuine folder comes back as the very environment (same id and content), so
    next to its original it is one candidate. Where two contents do meet under one id, content decides:
    propose rejects the second (`env_id_conflict`) and the import journal does not reuse the first's outcome."""
    from trajforge.tasks.envs.catalogue import merge_candidates
    from trajforge.tasks.envs.corpus import Journal, Outcome

    env = get_family("log_report").generate(1, 0)
    genuine = import_task(export_harbor(env, tmp_path / "g"))
    assert genuine.env_id == env.env_id and genuine.content_hash() == env.content_hash()
    folder = export_harbor(env, tmp_path / "f")
    weakened = [t for t in (folder / "tests").rglob("*") if t.is_file() and t.suffix == ".py" and "runner" not in t.name]
    assert weakened, list((folder / "tests").rglob("*"))
    for test in weakened:
        test.write_text("def test_anything():\n    assert True\n")
    forged = import_task(folder)
    assert forged.env_id != env.env_id and forged.env_id.startswith("harbor-")
    (folder / "task.toml").write_text((folder / "task.toml").read_text().replace("trajforge_seed = 0", "trajforge_seed = 1"))
    assert import_task(folder).env_id.startswith("harbor-"), "a record naming another seed is not believed either"
    assert merge_candidates([env, genuine, forged]) == ([env, forged], [])

    other = env.model_copy(update={"instruction": env.instruction + " (changed)"})  # one id, two contents
    kept, rejects = merge_candidates([env, other])
    assert kept == [env] and [r.reason for r in rejects] == ["env_id_conflict"]
    assert rejects[0].key == env.env_id and "procedural:log_report" in rejects[0].detail

    journal = Journal(None)
    journal.add(Outcome(env.env_id, env.source, "kept", content=env.content_hash()))
    assert journal.holds(genuine) and not journal.holds(other)
    journal.add(Outcome(env.env_id, env.source, "kept"))  # a line without content (older, or planted)
    assert not journal.holds(env) and not journal.holds(other)  # checked again


def test_write_tree_names_hashes_and_refuses_what_has_no_harbor_form(tmp_path):
    envs = [get_family(f).generate(1, 0) for f in ("log_report", "file_search")]
    manifest = write_tree(envs, tmp_path, build_id="b1", selection="kept", solutions=False)
    root = tmp_path / "tasks"
    assert [t["env_id"] for t in manifest["tasks"]] == [e.env_id for e in envs]
    assert [t["name"] for t in manifest["tasks"]] == [e.env_id for e in envs]  # env ids are folder-safe
    assert json.loads((root / "manifest.json").read_text()) == manifest and manifest["build_id"] == "b1"
    assert not list(root.glob("*/solution")), "no reference solution unless export.rl.include_solutions"
    assert {import_task(f).env_id for f in find_tasks(root)} == {e.env_id for e in envs}
    assert check_tree(root) == []
    (root / envs[0].env_id / "instruction.md").write_text("other\n")
    assert check_tree(root) == [f"{envs[0].env_id}/instruction.md: content differs from the manifest"]
    (root / envs[0].env_id / "instruction.md").write_text(envs[0].instruction + "\n")
    shutil.copytree(root / envs[1].env_id, root / "zz-contributed")  # a task folder slipped into the tree
    assert check_tree(root) == ["zz-contributed: not in the manifest"]
    shutil.rmtree(root / "zz-contributed")
    outside = dict(manifest, tasks=[*manifest["tasks"], {"name": "../../etc", "env_id": "x", "files": {}}])
    (root / "manifest.json").write_text(json.dumps(outside))
    assert check_tree(root) == ["manifest: task name '../../etc' is not a folder name of this tree"]

    with_solutions = write_tree(envs[:1], tmp_path / "s", build_id="b1", selection="rl", solutions=True)
    assert "solution/solve.sh" in with_solutions["tasks"][0]["files"]
    broken = envs[0].model_copy(update={"dockerfile": "FROM trajforge/base:latest\n", "setup": ["true"]})
    with pytest.raises(EnvTreeError, match=f"environment {envs[0].env_id} cannot be exported"):
        write_tree([broken], tmp_path / "x", build_id="b1", selection="kept", solutions=False)
    tools = envs[0].model_copy(update={"kind": "tools"})
    with pytest.raises(EnvTreeError, match="kind 'tools' has no Harbor task form"):
        write_tree([tools], tmp_path / "y", build_id="b1", selection="kept", solutions=False)


# -- a real replay build, published with its environments and read back ----------------------------------

@pytest.fixture(scope="module")
def build(tmp_path_factory, prefect_api):
    """One committed replay build (2 procedural environments x 2 samples; every episode solves: `rl` is empty)."""
    from trajforge.flows.launch import run_build

    cfg = parse_config(small_config(tmp_path_factory.mktemp("runs"), dataset="penv"))
    return RunStore(cfg.runs, cfg.dataset), run_build(cfg)["build_id"]


def _env_ids(store: RunStore, build_id: str) -> list[str]:
    synth = store.read_build(build_id).committed("synthesize")
    parts = store.read_json(posixpath.join(synth, "manifest.json"))["parts"]
    return sorted(e.env_id for e in store.read_records(parts, EnvSpec))


def _records(store: RunStore, build_id: str, repo: str) -> list[dict]:
    path = posixpath.join(store.build_dir(build_id), "published.json")
    return [r for r in (store.read_json(path) if store.exists(path) else []) if r["repo_id"] == repo]


@pytest.mark.docker
@pytest.mark.slow
def test_publish_environments_as_a_harbor_tree_and_a_snapshot_imports_back_to_the_same_env_ids(
        build, hub_server, tmp_path):
    from huggingface_hub import DatasetCard, HfApi, snapshot_download
    from test_publish import _load_through_endpoint, _local_ids
    from typer.testing import CliRunner

    from trajforge.flows.cli import app

    store, b1 = build
    repo, ids = "org/with-envs", _env_ids(store, b1)
    assert len(ids) == 2
    assert environment_tree(store, b1, "rl", tmp_path / "t0").files == {}, "no rl rows: no rl environments"
    api = HfApi(endpoint=hub_server.endpoint, token="hf_test")
    rec = publish(store, b1, repo, api=api, environments="kept")
    files = hub_server.files(repo)
    assert len(hub_server.history(repo)) == 2, "the repo's first commit, then one commit: data, card and tree"
    tree = {p for p in files if p.startswith("tasks/")}
    manifest = json.loads(files[MANIFEST])
    assert manifest["build_id"] == b1 and manifest["selection"] == "kept" and manifest["solutions"] is False
    assert sorted(t["env_id"] for t in manifest["tasks"]) == ids
    assert tree == {MANIFEST} | {f"tasks/{t['name']}/{f}" for t in manifest["tasks"] for f in t["files"]}
    assert {f["path"] for f in rec["files"]} == set(files) - {".gitattributes"}
    card = DatasetCard(files["README.md"].decode())
    assert HEADING in card.text and "`tasks/` holds 2 environment(s)" in card.text
    assert f"hf download {repo} --repo-type dataset" in card.text
    assert sorted(c["config_name"] for c in card.data.configs) == ["sft", "trajectories"]

    snap = snapshot_download(repo, repo_type="dataset", revision=b1, local_dir=tmp_path / "snap",
                             endpoint=hub_server.endpoint, token="hf_test")
    tasks = os.path.join(snap, "tasks")
    assert check_tree(tasks) == [], "every file matches the manifest's sha256"
    assert sorted(import_task(f).env_id for f in find_tasks(tasks)) == ids
    result = CliRunner().invoke(app, ["envs", "import", tasks, "--out", str(tmp_path / "kept.jsonl"),
                                      "--state", str(tmp_path / "journal.jsonl"),
                                      "--log-dir", str(tmp_path / "logs")])
    assert result.exit_code == 0, result.output
    assert sorted(json.loads(line)["env_id"] for line in (tmp_path / "kept.jsonl").read_text().splitlines()) == ids

    # the data still loads with `datasets` (the tree is no config and no data_files pattern reaches it)
    got = _load_through_endpoint(hub_server.endpoint, tmp_path / "hf", repo, [("sft", b1)])
    assert got == [_local_ids(store, b1, "sft")]

    # published again without environments: the tree is deleted in that one commit, the data stays
    head = hub_server.head(repo)
    publish(store, b1, repo, api=api, environments="none", tag=False)
    after = hub_server.files(repo)
    assert hub_server.history(repo)[1]["id"] == head
    assert not [p for p in after if p.startswith("tasks/")] and HEADING not in after["README.md"].decode()
    assert {p for p in after if p.endswith(".parquet")} == {p for p in files if p.endswith(".parquet")}


@pytest.mark.docker
@pytest.mark.slow
def test_the_rl_selection_takes_the_rl_configs_environments_and_solutions_follow_its_rule(build, tmp_path):
    """`rl` = the env ids of the export's `rl/*.parquet` (this replay build has none: one is planted and removed);
    solutions only with `export.rl.include_solutions` (planted in build.json and restored)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    store, b1 = build
    ids = _env_ids(store, b1)
    rl_dir = posixpath.join(store.read_build(b1).committed("export"), "rl")
    record = store.build_record_path(b1)
    saved = store.read_json(record)
    try:
        os.makedirs(rl_dir)
        pq.write_table(pa.table({"env_id": [ids[1], ids[1]]}), posixpath.join(rl_dir, "train-x-00000.parquet"))
        tree = environment_tree(store, b1, "rl", tmp_path / "t1")
        assert [t["env_id"] for t in tree.manifest["tasks"]] == [ids[1]] and tree.manifest["solutions"] is False
        assert not [p for p in tree.files if "/solution/" in p]
        assert all(f.is_file() and (tmp_path / "t1") in f.parents for f in tree.files.values())  # on disk, not held
        store.write_json(record, {**saved, "config": {**saved["config"], "export": {
            **saved["config"]["export"], "rl": {"include_solutions": True}}}})
        tree = environment_tree(store, b1, "rl", tmp_path / "t2")
        assert tree.manifest["solutions"] is True and f"tasks/{ids[1]}/solution/solve.sh" in tree.files
        pq.write_table(pa.table({"env_id": ["nope-l1-s0"]}), posixpath.join(rl_dir, "train-x-00001.parquet"))
        with pytest.raises(EnvTreeError, match="the rl config names environments synthesize did not keep: nope-l1-s0"):
            environment_tree(store, b1, "rl", tmp_path / "t3")
    finally:
        shutil.rmtree(rl_dir, ignore_errors=True)
        store.write_json(record, saved)
    assert environment_tree(store, b1, "rl", tmp_path / "t4").files == {}


@pytest.mark.docker
@pytest.mark.slow
def test_an_environment_that_cannot_be_exported_or_a_refused_file_publishes_nothing(build, hub_server, tmp_path):
    from huggingface_hub import HfApi

    store, b1 = build
    repo = "org/envs-refused"
    api = HfApi(endpoint=hub_server.endpoint, token="hf_test")
    api.create_repo(repo, repo_type="dataset")
    head = hub_server.head(repo)

    # the Hub refuses the commit holding the tree: named by the client, main untouched, nothing recorded
    hub_server.fail("commit")
    with pytest.raises(Exception, match="injected failure"):
        publish(store, b1, repo, api=api, environments="kept")
    assert hub_server.head(repo) == head and not _records(store, b1, repo)

    # an environment the Harbor exporter refuses (setup commands on a custom Dockerfile): PublishError naming it
    synth = store.read_build(b1).committed("synthesize")
    part = store.read_json(posixpath.join(synth, "manifest.json"))["parts"][0]
    saved = tmp_path / "part.parquet"
    shutil.copyfile(part, saved)
    envs = store.read_records([part], EnvSpec)
    bad = envs[0].env_id
    try:
        store.write_records(part, EnvSpec, [envs[0].model_copy(update={"dockerfile": "FROM x\n", "setup": ["true"]}),
                                            *envs[1:]])
        with pytest.raises(PublishError, match=f"environment {bad} cannot be exported as a Harbor task"):
            publish(store, b1, repo, api=api, environments="kept")
        with pytest.raises(PublishError, match="'all' is not one of none, rl, kept"):
            publish(store, b1, repo, api=api, environments="all")
    finally:
        shutil.copyfile(saved, part)
    assert hub_server.head(repo) == head and set(hub_server.files(repo)) <= {".gitattributes", "README.md"}
    assert not _records(store, b1, repo)


def test_synthesize_plan_keeps_one_content_per_env_id_across_propose_shards(tmp_path):
    """Two propose shards each merge their own candidates; synthesize's plan sees them all: another content
    under an id becomes an `env_id_conflict` reject, and the kept content (the higher-priority source) is
    pinned for the shard that validates it, instead of whichever record is read last."""
    from types import SimpleNamespace

    from trajforge.tasks.engine.contract import Manifest
    from trajforge.tasks.synthesize import SynthesizeStage

    store = RunStore(str(tmp_path / "runs"), "conflict")
    env = get_family("log_report").generate(1, 0)
    imposter = env.model_copy(update={"source": "harbor", "instruction": env.instruction + " (other content)"})
    other = get_family("file_search").generate(1, 0)
    parts = [str(tmp_path / "p0.parquet"), str(tmp_path / "p1.parquet")]
    store.write_records(parts[0], EnvSpec, [env, other])
    store.write_records(parts[1], EnvSpec, [imposter])  # read last
    config = parse_config(small_config(tmp_path / "runs", **{"synthesize.dedup_threshold": None,
                                                              "synthesize.envs_per_shard": 1}))
    manifest = Manifest.model_construct(parts=parts)
    shards = SynthesizeStage().plan(SimpleNamespace(store=store, config=config), {"propose": manifest})
    assert sorted(i for s in shards for i in s.payload["env_ids"]) == sorted([env.env_id, other.env_id])
    conflicts = [r for s in shards for r in s.payload.get("conflicts", [])]
    assert [(r["key"], r["reason"]) for r in conflicts] == [(env.env_id, "env_id_conflict")]
    pinned = {k: v for s in shards for k, v in s.payload.get("contents", {}).items()}
    assert pinned == {env.env_id: env.content_hash()}


def test_a_folder_named_like_an_environment_never_stands_in_for_it(tmp_path):
    """`trajforge verify --envs DIR` finds environments by id, and task folders by name too: but a folder
    whose name is a procedural id (or another environment's id) is found only by its own id."""
    from trajforge.tasks.envs.catalogue import load_paths

    env = get_family("log_report").generate(1, 0)
    tree = tmp_path / "tree"
    other, plain = get_family("file_search").generate(1, 0), get_family("csv_convert").generate(1, 0)
    shutil.copytree(export_harbor(other, tmp_path / "x"), tree / env.env_id)  # another task, named like env
    shutil.copytree(export_harbor(plain, tmp_path / "y"), tree / "my-task")
    harbor_id = "harbor-count-errors-6f365d57a0c1e2b4"  # an imported environment's id, not among these paths
    shutil.copytree(tree / "my-task", tree / harbor_id)
    shutil.copytree(tree / "my-task", tree / "log_report-l1-s0")
    envs, rejects = load_paths([str(tree)])
    assert env.env_id not in envs and harbor_id not in envs and "log_report-l1-s0" not in envs and not rejects
    assert envs["my-task"].env_id == plain.env_id and envs[other.env_id] == other  # a plain name still finds it


def test_a_tree_with_a_secret_is_refused_naming_the_file_and_detector_not_the_value():
    """The export scans the data; the tree is scanned too: a token in an environment's files stops the
    publish (a task's files are not redacted: that would change what runs)."""
    from trajforge.tasks.dataset.env_tree import refuse_secrets
    from trajforge.tasks.redaction.secrets import Scanner

    token = "hf_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789"
    files = {"tasks/a/environment/Dockerfile": f"FROM base\nENV HF_TOKEN={token}\n".encode(),
             "tasks/a/instruction.md": b"Count the errors.\n"}
    with pytest.raises(EnvTreeError, match=r"tasks/a/environment/Dockerfile \(Hugging Face Token\)") as err:
        refuse_secrets(files, Scanner())
    assert token not in str(err.value) and "instruction.md" not in str(err.value)
    refuse_secrets({"tasks/a/instruction.md": b"Count the errors.\n"}, Scanner())  # nothing found: no error


@pytest.mark.docker
def test_a_context_file_named_like_the_built_dockerfile_is_refused_before_building(tmp_path, docker_client):
    """A task's build context holding `.trajforge.Dockerfile` (a later tar entry of that name would replace
    the Dockerfile trajforge builds and records) fails with its cause named, before Docker is asked to build."""
    from trajforge.tasks.envs.images import DOCKERFILE_NAME, ImageBuildError, ensure_image

    folder = export_harbor(get_family("log_report").generate(1, 0), tmp_path)
    (folder / "environment" / DOCKERFILE_NAME).write_text("FROM trajforge/base:latest\nRUN echo hidden\n")
    env = import_task(folder)
    with pytest.raises(ImageBuildError, match=f"file named {re.escape(DOCKERFILE_NAME)}") as err:
        ensure_image(docker_client, "trajforge/base:latest", env)
    assert err.value.cause == "reserved_name"


def test_the_tree_scan_reads_what_docker_would_see_encoded_packed_or_continued():
    """UTF-16 text, a tar.gz that Docker's ADD unpacks, and a token split by a Dockerfile line continuation
    are read as the build would read them: each refused."""
    import gzip
    import io
    import tarfile

    from trajforge.tasks.dataset.env_tree import refuse_secrets
    from trajforge.tasks.redaction.secrets import Scanner

    token = "hf_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789"
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w") as tar:
        data = f"token={token}\n".encode()
        info = tarfile.TarInfo("creds/hub.env")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    files = {"tasks/a/environment/hub.env": f"HF_TOKEN={token}\n".encode("utf-16"),
             "tasks/a/environment/creds.tar.gz": gzip.compress(packed.getvalue()),
             "tasks/a/environment/Dockerfile": f"FROM base\nENV HF_TOKEN={token[:12]}\\\n    {token[12:]}\n".encode()}
    for path, data in files.items():
        with pytest.raises(EnvTreeError, match=re.escape(path)):
            refuse_secrets({path: data}, Scanner())
