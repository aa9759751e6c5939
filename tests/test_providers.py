"""The sandbox provider seam: which engine a worker uses, what it can do, and refusals that name it.

The URL provider is proven against a real second `dockerd` this module starts on its own socket and
data root (the base image loaded into it): a rollout and its verification there give the verdicts the
local engine gives. A toy provider, registered from this test, shows a third provider is one class
plus one `register` line.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import docker
import pytest
from helpers import small_config

from trajforge.flows.doctor import docker_checks
from trajforge.schemas.config import SandboxConfig, parse_config
from trajforge.tasks.agent.driver import run_episodes
from trajforge.tasks.engine import StageContext
from trajforge.tasks.engine.identity import owner_label
from trajforge.tasks.envs.families import get_family
from trajforge.tasks.envs.images import ensure_image
from trajforge.tasks.sandbox import DockerUnavailable, docker_client
from trajforge.tasks.sandbox.providers import (
    ENV,
    PROVIDERS,
    Capabilities,
    DockerURL,
    EngineLacks,
    LocalEngine,
    Provider,
    engine_url,
    provider_for,
    register,
)
from trajforge.tasks.verify import verify_rollouts

BASE = "trajforge/base:latest"
DEAD = "unix:///nonexistent/trajforge/d.sock"


class _ToyClient:
    def close(self) -> None:
        pass


class ToySandboxes(Provider):
    """A managed sandbox service speaking the Docker API, as a toy: no host-side reads, no build cgroup."""

    name, schemes = "toy", ("toy",)

    def client(self, pool_size: int = 10):
        return _ToyClient()

    def capabilities(self, client, sandbox=None) -> Capabilities:
        return Capabilities(storage_cap=True, tmpfs=True)


@pytest.fixture
def toy():
    saved = dict(PROVIDERS)
    register(ToySandboxes)  # the one registry line a third provider needs
    yield
    PROVIDERS.clear()
    PROVIDERS.update(saved)


def _ctx(tmp_path, **over):
    return StageContext.create(parse_config(small_config(tmp_path / "runs", **over)), "b")


def test_the_worker_variable_wins_over_the_config_which_wins_over_the_local_engine(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert engine_url(SandboxConfig()) == (None, "the local default")
    assert engine_url(SandboxConfig(engine="/run/b.sock")) == ("/run/b.sock", "sandbox.engine")
    monkeypatch.setenv(ENV, "ssh://w@hostb")
    assert engine_url(SandboxConfig(engine="/run/b.sock")) == ("ssh://w@hostb", f"${ENV}")
    assert isinstance(provider_for(None), LocalEngine)
    p = provider_for("/run/b.sock")
    assert isinstance(p, DockerURL) and p.url == "unix:///run/b.sock"
    with pytest.raises(DockerUnavailable, match=r"'k8s://x' names no sandbox provider \(known: local://, ssh://"):
        provider_for("k8s://x")


def test_an_engine_that_does_not_answer_is_named_before_any_episode(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    ctx = _ctx(tmp_path, **{"sandbox.engine": DEAD})
    env = get_family("log_report").generate(1, 0)
    with pytest.raises(DockerUnavailable, match=f"cannot reach the Docker engine docker-url {DEAD} "
                                                r"\(from sandbox.engine, on host "):
        run_episodes(ctx, {env.env_id: env}, [(env.env_id, 0)])
    assert not any((tmp_path / "runs").rglob("part-*")), "nothing was written: no episode ran"
    monkeypatch.setenv(ENV, DEAD)  # a worker's variable is named as the origin
    with pytest.raises(DockerUnavailable, match=rf"from \${ENV}"):
        docker_client()


def test_tcp_is_spoken_only_with_tls_and_missing_certificates_are_named(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAJFORGE_DOCKER_CERT_PATH", str(tmp_path))
    with pytest.raises(DockerUnavailable, match=f"only with TLS, and {tmp_path} lacks ca.pem, cert.pem, key.pem"):
        docker_client(sandbox=SandboxConfig(engine="tcp://127.0.0.1:2376"))


def test_a_toy_provider_is_one_class_and_one_line_and_the_verifier_refuses_what_it_lacks(tmp_path, toy, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    ctx = _ctx(tmp_path, **{"sandbox.engine": "toy://pool-1", "sandbox.require": ["host_reads"]})
    with pytest.raises(EngineLacks, match=r"engine toy toy://pool-1 \(from sandbox.engine, on host .*\) lacks "
                                          r"host_reads \(host-side reads .*\), which sandbox.require needs"):
        verify_rollouts(ctx, {}, [])
    assert isinstance(docker_client(sandbox=SandboxConfig(engine="toy://pool-1", work_tmpfs_mb=64)), _ToyClient)
    register(type("NoTmpfs", (ToySandboxes,), {"capabilities": lambda self, c, s=None: Capabilities()}))
    with pytest.raises(EngineLacks, match="lacks tmpfs .*, which sandbox.work_tmpfs_mb needs"):
        docker_client(sandbox=SandboxConfig(engine="toy://pool-1", work_tmpfs_mb=64))


@pytest.mark.docker
def test_doctor_checks_every_engine_the_config_names(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    cfg = parse_config(small_config(tmp_path / "runs", **{"sandbox.require": ["user_namespaces"]}))
    rows = {c.name: c for c in docker_checks(cfg)}
    assert rows["docker engine"].status == "ok"
    caps = rows["engine capabilities"]  # this engine runs without userns-remap
    assert caps.status == "fail" and "local lacks user_namespaces" in caps.detail and "sandbox.require" in caps.detail
    monkeypatch.setenv(ENV, "unix:///var/run/docker.sock")  # this host's worker: the local socket; the config: dead
    cfg = parse_config(small_config(tmp_path / "runs", **{"sandbox.engine": DEAD}))
    rows = {c.name: c for c in docker_checks(cfg)}
    assert rows["docker engine"].status == "ok" and f"from ${ENV}" in rows["docker engine"].detail
    assert rows[f"docker engine @ {DEAD}"].status == "fail" and DEAD in rows[f"docker engine @ {DEAD}"].detail


def _verdicts(tmp_path, monkeypatch, engine: str | None) -> tuple[list[tuple], list[str]]:
    """Verdicts of one log_report environment's solution and of a wrong answer, rolled out and verified on
    `engine` (None: the local one, through its worker variable unset), and the containers created there."""
    monkeypatch.delenv(ENV, raising=False)
    tmp_path.mkdir()
    env = get_family("log_report").generate(1, 0)
    rec = tmp_path / "rec.jsonl"
    rec.write_text("".join(json.dumps({"env_id": env.env_id, "commands": c}) + "\n"
                           for c in (env.solution, ["echo 0 > report.txt"])))
    ctx = _ctx(tmp_path, **{"teacher": {"backend": "replay", "replay": {"source": str(rec)}},
                            "sandbox.engine": engine, "sandbox.require": ["host_reads"]})
    client = docker_client(sandbox=ctx.config.sandbox)
    env.image, _ = ensure_image(client, BASE, env)
    since = int(time.time()) - 1
    rollouts = run_episodes(ctx, {env.env_id: env}, [(env.env_id, 0), (env.env_id, 1)]).rows
    verdicts = verify_rollouts(ctx, {env.env_id: env}, rollouts).rows
    created = [e["Actor"]["Attributes"].get("trajforge.build") for e in
               client.events(since=since, until=int(time.time()) + 1, decode=True,
                             filters={"type": "container", "event": "create", "label": "trajforge.build=b"})]
    client.close()
    return [(v.sample, v.status, v.verified, v.reward, v.tests_passed, v.passed, v.mode, v.hack_flags,
             [(t.name, t.passed) for t in v.tests]) for v in verdicts], created


@pytest.mark.docker
def test_a_second_engine_by_url_gives_the_local_verdicts(tmp_path, monkeypatch, second_engine):
    sock, client = second_engine
    there, created = _verdicts(tmp_path / "b", monkeypatch, sock)
    assert created, "the episodes' sandboxes were created on the second engine"
    here, _ = _verdicts(tmp_path / "a", monkeypatch, None)
    assert [v[5] for v in here] == [True, False]
    assert there == here
    assert client.containers.list(all=True) == [], "no sandbox outlives its stage on the second engine"


@pytest.mark.docker
def test_reaping_a_worker_host_cleans_the_engine_the_config_names(monkeypatch, second_engine, docker_client):
    """A dead owner's sandbox on the config's engine is removed by `reap_here(engine=...)` (what each Dask
    worker runs); reaping the local engine leaves it, and a live owner's sandbox is never touched."""
    from trajforge.tasks.sandbox import LABEL, reap_here

    monkeypatch.delenv(ENV, raising=False)
    sock, client = second_engine
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = socket.gethostname()
    labels = {LABEL: "1", "trajforge.build": "reap-test"}
    orphan = client.containers.run(BASE, ["sleep", "600"], detach=True, network_mode="none",
                                   labels={**labels, "trajforge.owner": f"{host}:{dead.pid}"})
    alive = client.containers.run(BASE, ["sleep", "600"], detach=True, network_mode="none",
                                  labels={**labels, "trajforge.owner": owner_label()})
    try:
        reap_here()  # the local engine: nothing of the second engine's
        assert {c.id for c in client.containers.list(all=True)} >= {orphan.id, alive.id}
        assert reap_here(engine=sock) == 1
        assert [c.id for c in client.containers.list(all=True)] == [alive.id]
    finally:
        for c in (orphan, alive):
            try:
                c.remove(force=True)
            except docker.errors.NotFound:
                pass
