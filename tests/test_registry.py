"""Images by digest through a registry (issue 30 item 2): an environment image is built once, pushed to a
real registry (Debian's `docker-registry`) with its digest on record in the run store, and a second real
Docker engine pulls it by that digest before its first sandbox, instead of building it; without a
registry that engine builds it itself. A registry that refuses is named."""

from __future__ import annotations

import json

import docker
import docker.errors
import pytest
from helpers import small_config

from trajforge.schemas.config import ConfigError, parse_config
from trajforge.tasks.agent.driver import run_episodes
from trajforge.tasks.engine import StageContext
from trajforge.tasks.engine.store import RunStore
from trajforge.tasks.envs.families import get_family
from trajforge.tasks.envs.images import ensure_image
from trajforge.tasks.envs.registry import (
    ImageRecord,
    RegistryError,
    bring_all_here,
    bring_here,
    builder,
    lookup,
    pull,
    push,
    record_path,
)

BASE = "trajforge/base:latest"


def _absent(client: docker.DockerClient, tag: str) -> None:
    for image in client.images.list(filters={"label": "trajforge.image=env"}):
        if tag in image.tags or any(t.split("/", 1)[-1].startswith("trajforge/env") for t in image.tags):
            client.images.remove(image.id, force=True)
    with pytest.raises(docker.errors.ImageNotFound):
        client.images.get(tag)


def _never_build(env) -> str:
    raise AssertionError(f"{env.env_id} was built although its digest is on record")


@pytest.mark.docker
def test_built_once_pushed_and_pulled_by_digest_on_a_second_engine(tmp_path, docker_client, second_engine, registry):
    _, there = second_engine
    env = get_family("log_report").generate(1, 3)
    env.image, _ = ensure_image(docker_client, BASE, env)
    store = RunStore(str(tmp_path / "runs"), "t")
    _absent(there, env.image)

    rec = push(docker_client, env.image, registry, store)
    assert rec.digest.startswith("sha256:") and lookup(store, registry, env.image) == rec
    on_record = json.loads((tmp_path / "runs" / "t" / "images" / (env.image.split(":")[1] + ".json")).read_text())
    assert on_record["digest"] == rec.digest and on_record["tag"] == env.image

    assert bring_here(there, env, store, registry, _never_build) == "pulled"
    pulled = there.images.get(env.image)
    assert pulled.id == docker_client.images.get(env.image).id, "the same image, not a look-alike"
    assert f"{registry}/trajforge/env@{rec.digest}" in pulled.attrs["RepoDigests"]
    assert bring_here(there, env, store, registry, _never_build) == "present"

    _absent(there, env.image)  # no registry: the engine builds what it lacks, under the same tag
    assert bring_here(there, env, store, None, builder(there, BASE)) == "built"
    assert there.images.get(env.image).labels.get("trajforge.image") == "env"


@pytest.mark.docker
def test_a_stage_on_the_second_engine_pulls_then_runs_there(tmp_path, docker_client, second_engine, registry,
                                                              monkeypatch):
    """What a rollout shard on another host does: `bring_all_here` (the image pushed by the engine that has
    it, pulled by digest on this one), then its episodes run on this engine and the solution passes."""
    monkeypatch.delenv("TRAJFORGE_DOCKER_HOST", raising=False)
    sock, there = second_engine
    env = get_family("log_report").generate(1, 4)
    env.image, _ = ensure_image(docker_client, BASE, env)
    _absent(there, env.image)
    rec = tmp_path / "rec.jsonl"
    rec.write_text(json.dumps({"env_id": env.env_id, "commands": env.solution}) + "\n")
    here = StageContext.create(parse_config(small_config(tmp_path / "runs", **{"sandbox.registry": registry})), "b")
    assert bring_all_here(here, [env]) == {"images_present": 1, "images_pulled": 0, "images_built_here": 0}
    assert lookup(here.store, registry, env.image) is not None, "the engine that had it pushed it"
    ctx = StageContext.create(parse_config(small_config(
        tmp_path / "runs", **{"sandbox.registry": registry, "sandbox.engine": sock,
                              "teacher": {"backend": "replay", "replay": {"source": str(rec)}}})), "b")
    assert bring_all_here(ctx, [env]) == {"images_present": 0, "images_pulled": 1, "images_built_here": 0}
    rows = run_episodes(ctx, {env.env_id: env}, [(env.env_id, 0)]).rows
    assert [r.status for r in rows] == ["ok"]
    tests = rows[0].in_place_tests
    assert tests is not None and tests.results and all(t.passed for t in tests.results), tests
    assert there.containers.list(all=True) == []


@pytest.mark.docker
def test_a_registry_that_refuses_is_named(tmp_path, docker_client, registry):
    env = get_family("log_report").generate(1, 3)
    env.image, _ = ensure_image(docker_client, BASE, env)
    store = RunStore(str(tmp_path / "runs"), "t")
    with pytest.raises(RegistryError, match=r"pushing trajforge/env:\w+ to the registry 127\.0\.0\.1:1 "
                                            r"\(sandbox\.registry\) failed"):
        push(docker_client, env.image, "127.0.0.1:1", store)
    assert not store.exists(record_path(store, env.image)), "nothing on record for a push that failed"
    missing = ImageRecord(env.image, registry, "sha256:" + "0" * 64)
    with pytest.raises(RegistryError, match=rf"pulling {registry}/trajforge/env@sha256:0+ .* failed"):
        pull(docker_client, missing)


def test_a_registry_address_is_checked(tmp_path):
    for bad in ("http://127.0.0.1:5000", "127.0.0.1:5000/", " "):
        with pytest.raises(ConfigError, match=r"sandbox\.registry"):
            parse_config(small_config(tmp_path / "runs", **{"sandbox.registry": bad}))
    cfg = parse_config(small_config(tmp_path / "runs", **{"sandbox.registry": "registry.internal:5000/team"}))
    assert cfg.sandbox.registry == "registry.internal:5000/team"


@pytest.mark.docker
def test_doctor_checks_the_registry_a_config_names(registry):
    from trajforge.flows.doctor import registry_check

    ok = registry_check(registry)
    assert ok.status == "ok" and "over http" in ok.detail and "--insecure-registry" in ok.detail
    dead = registry_check("127.0.0.1:1", timeout=2)
    assert dead.status == "fail" and "sandbox.registry" in dead.detail and "127.0.0.1:1" in dead.detail
