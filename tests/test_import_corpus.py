"""Importing corpora shaped like published ones (issue 17): no `solution/`, binary data files, Dockerfiles
`FROM` a registry image that `apt-get install` at build time, pytest-style `test.sh` writing `reward.txt`.

Fixtures: `tests/fixtures/corpus/` (`gz-sum`: installs `bc` from Debian's mirror, data in a gzip file;
`tally-words`: `FROM python:3.12-slim`, a PNG beside its text input).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import run_cli, small_config

from trajforge.schemas.config import DEFAULT_EGRESS_ALLOWLIST, SynthesizeConfig, fingerprint_view, parse_config
from trajforge.schemas.environment import EnvSpec
from trajforge.tasks.envs.blobs import BlobStore
from trajforge.tasks.envs.formats import TaskFormatError, export_harbor, import_task
from trajforge.tasks.envs.images import (
    CA_HINT,
    BuildOptions,
    ImageBuildError,
    base_mapping,
    classify,
    ensure_image,
    image_tag,
    render,
    with_ca,
)

CORPUS = Path(__file__).parent / "fixtures" / "corpus"
CA = "/etc/ssl/certs/ca-certificates.crt"
BASE_ID = "sha256:" + "0" * 64


@pytest.fixture(autouse=True)
def _blob_store(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("TRAJFORGE_BLOB_STORE", str(tmp_path_factory.getbasetemp() / "blobs"))


def test_task_without_solution_imports_with_binary_files_by_hash():
    env = import_task(CORPUS / "gz-sum")
    assert env.oracle == "absent" and env.solution == [] and env.build_timeout_s == 300
    assert [b.path for b in env.blobs] == ["numbers.gz"] and not any(f.path == "numbers.gz" for f in env.context)
    blob = env.blobs[0]
    assert BlobStore().get(blob.sha256) == (CORPUS / "gz-sum" / "environment" / "numbers.gz").read_bytes()
    assert len(env.model_dump_json()) < 4000  # the bytes live in the blob store, never in the spec
    assert EnvSpec.model_validate_json(env.model_dump_json()) == env
    words = import_task(CORPUS / "tally-words")
    assert [b.path for b in words.blobs] == ["logo.png"] and [c.path for c in words.context] == ["Dockerfile", "words.txt"]


def test_env_id_and_image_address_change_with_any_file(tmp_path):
    shutil.copytree(CORPUS / "gz-sum", tmp_path / "gz-sum")
    before = import_task(tmp_path / "gz-sum")
    assert before.env_id == import_task(CORPUS / "gz-sum").env_id  # content, not location
    (tmp_path / "gz-sum" / "environment" / "numbers.gz").write_bytes(b"\x1f\x8b not the same data \x00")
    after = import_task(tmp_path / "gz-sum")
    assert after.env_id != before.env_id and after.blobs[0].sha256 != before.blobs[0].sha256
    assert image_tag(BASE_ID, after) != image_tag(BASE_ID, before)
    shutil.copytree(CORPUS / "tally-words", tmp_path / "tally-words")
    words = import_task(tmp_path / "tally-words")
    (tmp_path / "tally-words" / "environment" / "words.txt").write_text("kiwi\n")  # a text data file
    edited = import_task(tmp_path / "tally-words")
    assert edited.env_id != words.env_id and image_tag(BASE_ID, edited) != image_tag(BASE_ID, words)


def test_binary_test_file_is_named(tmp_path):
    shutil.copytree(CORPUS / "tally-words", tmp_path / "t")
    (tmp_path / "t" / "tests" / "expected.bin").write_bytes(b"\x00\xff")
    with pytest.raises(TaskFormatError, match=r"expected.bin: binary file"):
        import_task(tmp_path / "t")


def test_an_oversized_task_folder_is_refused_before_anything_is_read(tmp_path):
    shutil.copytree(CORPUS / "gz-sum", tmp_path / "gz-sum")
    with open(tmp_path / "gz-sum" / "environment" / "weights.bin", "wb") as f:  # sparse: no disk, 300 MiB by stat
        f.truncate(300 << 20)
    with pytest.raises(TaskFormatError, match=r"holds 300\.\d MiB, over the 256 MiB a task may hold \(largest: "
                                              r"environment/weights.bin, 300\.0 MiB\)"):
        import_task(tmp_path / "gz-sum")
    (tmp_path / "gz-sum" / "environment" / "weights.bin").unlink()
    assert import_task(tmp_path / "gz-sum").env_id == import_task(CORPUS / "gz-sum").env_id


def test_links_and_path_bytes_count_toward_the_folder_bound(tmp_path):
    """A symlink inside the folder is read as a file, so it counts what it points at; names count too."""
    shutil.copytree(CORPUS / "gz-sum", tmp_path / "gz-sum")
    env = tmp_path / "gz-sum" / "environment"
    with open(env / "weights.bin", "wb") as f:  # sparse: 100 MiB by stat, no disk
        f.truncate(100 << 20)
    (env / "copy1.bin").symlink_to("weights.bin")
    assert import_task(tmp_path / "gz-sum")  # 200 MiB with the link: within the bound
    (env / "copy2.bin").symlink_to("weights.bin")
    with pytest.raises(TaskFormatError, match=r"holds 300\.\d MiB, over the 256 MiB"):
        import_task(tmp_path / "gz-sum")
    for name in ("weights.bin", "copy1.bin", "copy2.bin"):
        (env / name).unlink()
    many = env / "many"
    many.mkdir()
    for i in range(20_001):  # empty files: no content, only entries
        (many / f"{i}").touch()
    with pytest.raises(TaskFormatError, match=r"holds more than 20000 files and folders"):
        import_task(tmp_path / "gz-sum")


def test_moving_a_file_boundary_changes_the_folder_digest(tmp_path):
    """The digest length-prefixes each path and content: `a`+`b` and `a+<path of b>+b` in one file differ."""
    from trajforge.tasks.envs.formats import folder_digest

    one, two = tmp_path / "one" / "t", tmp_path / "two" / "t"
    for d in (one, two):
        (d / "server").mkdir(parents=True)
    (one / "server" / "board.py").write_text("X = 1\n")
    (one / "server" / "server.py").write_text("Y = 2\n")
    (two / "server" / "board.py").write_text("X = 1\n" + "server/server.py" + "Y = 2\n")
    assert folder_digest(one) != folder_digest(two)


@pytest.mark.parametrize("folder, meta, old, new, says", [
    ("harbor/count-words", "task.toml", "timeout_sec = 60.0", "timeout_sec = 1e9",
     r"\[verifier\].timeout_sec is 1e\+09 s, over the 3600 s a task may set for itself"),
    ("harbor/count-words", "task.toml", "timeout_sec = 300.0\n\n[environment]", "timeout_sec = 86400\n\n[environment]",
     r"\[agent\].timeout_sec is 86400 s, over the 14400 s"),
    ("harbor/count-words", "task.toml", "build_timeout_sec = 300.0", "build_timeout_sec = 7201",
     r"\[environment\].build_timeout_sec is 7201 s, over the 7200 s"),
    ("tbench/sort-names", "task.yaml", "max_test_timeout_sec: 60", "max_test_timeout_sec: 3601",
     r"max_test_timeout_sec is 3601 s, over the 3600 s"),
])
def test_a_task_cannot_give_itself_an_unbounded_timeout(tmp_path, folder, meta, old, new, says):
    """A task's own timeouts win over the build's; they are bounded so a task cannot hold a worker forever."""
    shutil.copytree(Path(__file__).parent / "fixtures" / folder, tmp_path / "t")
    path = tmp_path / "t" / meta
    assert old in path.read_text()
    path.write_text(path.read_text().replace(old, new))
    with pytest.raises(TaskFormatError, match=says):
        import_task(tmp_path / "t")
    env = import_task(Path(__file__).parent / "fixtures" / folder)
    with pytest.raises(ValueError, match="less than or equal to 3600"):  # nor through a spec written elsewhere
        EnvSpec.model_validate({**env.model_dump(), "test_timeout_s": 1e9})


def test_registry_bases_map_to_local_ones_and_are_recorded():
    aliases = SynthesizeConfig(imports=["x"]).image_aliases
    env = import_task(CORPUS / "gz-sum")
    assert base_mapping(env, aliases, "trajforge/base:latest") == {
        "ghcr.io/example-org/ubuntu-24-04:20250601": "trajforge/base:latest"}
    words = import_task(CORPUS / "tally-words")
    assert base_mapping(words, {"python:3.*": "trajforge/base-py:latest"}, "b") == {
        "python:3.12-slim": "trajforge/base-py:latest"}
    assert base_mapping(words, {}, "b") == {"python:3.12-slim": "python:3.12-slim"}  # unmapped: kept, recorded


def test_ca_bundle_and_network_stay_out_of_the_image_address():
    env = import_task(CORPUS / "gz-sum")
    dockerfile, _ = render(env, BASE_ID, {"*/ubuntu-*:*": "{base}"})
    text = with_ca(dockerfile)
    assert text.count("COPY .trajforge-build-ca.crt") == 1 and "PIP_CERT=" in text and "REQUESTS_CA_BUNDLE=" in text
    assert text.rstrip().endswith("rm -f /usr/local/share/trajforge-build-ca.crt")
    assert BuildOptions(egress="allowlist").networked(env) and not BuildOptions().networked(env)
    from trajforge.tasks.envs.families import get_family

    assert not BuildOptions(egress="allowlist").networked(get_family("log_report").generate(1, 0))


def test_build_failure_causes():
    assert classify("E: Unable to locate package nosuchpkg") == "package_not_found"
    assert classify("Temporary failure resolving 'deb.debian.org'") == "build_fetch_failed"
    assert classify("pull access denied for registry.example.com/x") == "base_image_missing"
    assert classify('Get "https://registry.example.com/v2/": dial tcp: lookup registry.example.com') == \
        "base_image_missing"
    assert classify("The command '/bin/sh -c exit 3' returned a non-zero code: 3") == "build_step_failed"
    assert classify("curl: (60) SSL certificate problem: self-signed certificate in certificate chain") == \
        "build_fetch_failed"


def test_host_ca_bundle_is_the_default_for_networked_builds(tmp_path, monkeypatch):
    """Without `ca_bundle` (or `--ca-bundle`), builds take the host's own: the first of SSL_CERT_FILE,
    PIP_CERT, REQUESTS_CA_BUNDLE that names a file (issue 28)."""
    from trajforge.tasks.synthesize import build_options

    bundle = tmp_path / "proxy-ca.crt"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    for var in ("SSL_CERT_FILE", "PIP_CERT", "REQUESTS_CA_BUNDLE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "missing.crt"))  # set, but no such file: skipped
    monkeypatch.setenv("PIP_CERT", str(bundle))
    s = SynthesizeConfig(imports=["x"])
    assert build_options(s).ca_bundle == str(bundle)  # what a build's synthesize stage uses
    assert BuildOptions.from_config(s.build).ca_bundle == str(bundle)  # what `envs import` uses
    explicit = SynthesizeConfig(imports=["x"], build={"ca_bundle": CA})
    assert BuildOptions.from_config(explicit.build).ca_bundle == CA  # the configured one wins
    assert BuildOptions.from_config(s.build, environ={}).ca_bundle is None


@pytest.mark.docker
def test_certificate_failure_names_ca_bundle(tmp_path, docker_client):
    """A build whose step fails a certificate check says to pass --ca-bundle: in the error, the reject
    detail and the import's report."""
    task = tmp_path / "corpus" / "pip-behind-proxy"
    shutil.copytree(CORPUS / "tally-words", task)
    (task / "environment" / "nonce.txt").write_text(str(tmp_path))
    (task / "environment" / "Dockerfile").write_text(
        "FROM debian:bookworm\nCOPY nonce.txt /nonce.txt\nRUN echo 'Could not fetch URL https://pypi.org/simple/x/: "
        "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed certificate' && exit 1\n")
    env = import_task(task)
    with pytest.raises(ImageBuildError) as err:
        ensure_image(docker_client, "trajforge/base:latest", env, SynthesizeConfig(imports=["x"]).image_aliases)
    assert err.value.hint == CA_HINT and "--ca-bundle" in str(err.value).splitlines()[0]
    assert err.value.cause == "build_fetch_failed"
    out = run_cli("envs", "import", str(tmp_path / "corpus"), "--fresh", cwd=tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "1 image build(s) failed a certificate check" in out.stderr and "--ca-bundle" in out.stderr, out.stderr
    assert "pass --ca-bundle" in out.stdout  # the environment's own line says so too


def test_config_marks_operational_build_settings():
    s = SynthesizeConfig(imports=["x"], build={"ca_bundle": CA, "https_proxy": "http://p:3128", "timeout_s": 60})
    assert fingerprint_view(s)["build"] == {"egress": "allowlist", "allowlist": list(DEFAULT_EGRESS_ALLOWLIST), "allowlist_extra": []} and s.require_solution is False
    assert ("HTTPS_PROXY", "http://p:3128") in s.build.proxies()


def test_harbor_export_without_oracle_round_trips(tmp_path):
    env = import_task(CORPUS / "gz-sum")
    out = export_harbor(env, tmp_path)
    assert not (out / "solution").exists()
    assert (out / "environment" / "numbers.gz").read_bytes() == (CORPUS / "gz-sum/environment/numbers.gz").read_bytes()
    back = import_task(out)
    assert back.oracle == "absent" and back.blobs == env.blobs and back.build_timeout_s == env.build_timeout_s


# ------------------------------------------------------------------------------------------------
RIGHT = {"gz-sum": "zcat /app/numbers.gz | paste -sd+ | bc > /app/total.txt",  # bc: installed at build time
         "tally-words": "sort /app/words.txt | uniq -c | sort -rn | head -1 | awk '{print $2}' > /app/top.txt"}
WRONG = {"gz-sum": "echo 0 > /app/total.txt", "tally-words": "echo pear > /app/top.txt"}


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_corpus_end_to_end_without_oracle(tmp_path):
    """import -> validate without oracle (networked build with the host CA) -> rollouts replaying recorded
    commands -> verify -> calibrate -> export: `rl` carries only the environment a teacher proved solvable."""
    import datasets

    from trajforge.flows.launch import run_build
    from trajforge.tasks.engine.store import RunStore

    corpus = tmp_path / "corpus"
    shutil.copytree(CORPUS, corpus)
    for name in RIGHT:  # new images: this build builds them (under the default build policy)
        (corpus / name / "environment" / "nonce.txt").write_text(str(tmp_path))
    ids = {name: import_task(corpus / name).env_id for name in RIGHT}
    recorded = tmp_path / "recorded.jsonl"  # gz-sum: solved once of two; tally-words: never
    recorded.write_text("".join(json.dumps({"env_id": ids[n], "commands": c}) + "\n" for n, c in [
        ("gz-sum", [RIGHT["gz-sum"]]), ("gz-sum", [WRONG["gz-sum"]]),
        ("tally-words", [WRONG["tally-words"]]), ("tally-words", ["echo fig > /app/top.txt"])]))
    cfg = small_config(tmp_path / "runs", dataset="corpus", **{
        "synthesize": {"imports": [str(corpus)], "build": {"ca_bundle": CA}},
        "teacher": {"backend": "replay", "replay": {"source": str(recorded)}}})
    rec = run_build(parse_config(cfg))
    assert all(st["status"] == "committed" for st in rec["stages"].values()), rec["stages"]
    store = RunStore(cfg["runs"], "corpus")
    synth = store.read_json(f"{rec['stages']['synthesize']['manifest']}/manifest.json")
    assert synth["stats"]["kept_by_oracle"] == {"harbor|absent": 2} and synth["stats"]["yield"] == {"harbor|kept": 2}
    kept = {e.env_id: e for e in store.read_records(synth["parts"], EnvSpec)}
    gz = kept[ids["gz-sum"]]
    assert gz.oracle == "absent" and [(b.image, b.local) for b in gz.base_images] == [
        ("ghcr.io/example-org/ubuntu-24-04:20250601", "trajforge/base:latest")]
    logs = store.fs.glob(f"{store.build_dir(rec['build_id'])}/build-logs/*.log")
    assert any("bc" in store.fs.cat(p).decode() for p in logs)  # the build log is kept per image
    dataset = Path(cfg["runs"]) / "corpus" / "latest" / "dataset"
    traj = datasets.load_dataset(str(dataset), "trajectories")["train"]
    passed = {(r["env_id"], r["passed"]) for r in traj}
    assert gz.build_egress == "allowlist" and set(traj["build_egress"]) == {"allowlist"}  # the default policy built it
    assert passed == {(ids["gz-sum"], True), (ids["gz-sum"], False), (ids["tally-words"], False)}
    rl = datasets.load_dataset(str(dataset), "rl")["train"]
    assert rl["env_id"] == [ids["gz-sum"]]  # proven solvable by a verified pass; tally-words is not


@pytest.mark.docker
def test_envs_import_cli_samples_resumes_and_reports_yield(tmp_path):
    corpus = tmp_path / "corpus"
    shutil.copytree(CORPUS, corpus)
    shutil.copytree(CORPUS / "tally-words", corpus / "broken-build")
    (corpus / "broken-build" / "environment" / "Dockerfile").write_text(
        "FROM debian:bookworm\nRUN apt-get update -qq && apt-get install -y -qq nosuchpackage-trajforge\n")
    shutil.copytree(CORPUS / "tally-words", corpus / "no-instruction")
    (corpus / "no-instruction" / "instruction.md").unlink()
    args = ("envs", "import", str(corpus), "--ca-bundle", CA, "--out", str(tmp_path / "kept.jsonl"))
    cache = {"TRAJFORGE_CACHE": str(tmp_path / "cache")}  # the journal's default home
    out = run_cli(*args, "--sample", "2", "--seed", "1", cwd=tmp_path, env=cache)
    assert "parsed 2 task folder(s)" in out.stdout and "(sample of 2, seed 1)" in out.stdout, out.stdout + out.stderr
    out = run_cli(*args, cwd=tmp_path, env=cache)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "kept (no oracle)" in out.stdout and "package_not_found" in out.stdout
    assert "import_malformed=1" in out.stdout and "image_build_failed=1" in out.stdout
    assert len((tmp_path / "kept.jsonl").read_text().splitlines()) == 2
    assert list((tmp_path / ".trajforge" / "build-logs").glob("*.log"))
    again = run_cli(*args, cwd=tmp_path, env=cache)  # resumes: the kept ones come from the journal
    assert "resuming: 2 environment(s) already checked" in again.stdout, again.stdout
    assert len(list((tmp_path / "cache" / "imports").glob("import-*.jsonl"))) == 1
    assert not list((tmp_path / ".trajforge").glob("import-*.jsonl")), "no journal in the working directory"
    assert len((tmp_path / "kept.jsonl").read_text().splitlines()) == 2
