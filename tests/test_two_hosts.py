"""Issue 30 item 5: two "hosts" on one machine (`deploy/hosts/two-hosts.sh`, the walkthrough of
deploy/README.md "Two hosts on one machine"): network namespaces, each host with its own `dockerd` and its
own Dask worker; a registry, the Dask scheduler, the Prefect server, the driver and its (stand-in) teacher in
a third namespace, every part reached by the namespaces' addresses (198.51.100.0/24), none over loopback.

A build of 6 environments x 4 rollouts (6 rollout shards for 2 workers of 2 threads; the 6 images are built
in one synthesize shard, so on one engine) spreads its sandboxes over both engines, pulls images by digest on
the engine that did not build them, commits the verdict counts of the same config on one host, and leaves
no sandbox behind. Then a host dies mid-rollout of a build of the same size (its worker, its engine and
its sandboxes' processes killed): the build finishes on the other host with every row once, and the dead host's sandboxes are
reaped when it comes back."""

from __future__ import annotations

import json
import threading
import time

import docker
import pytest
from hosts_kit import HUB, SEEDS, Hosts, Sandboxes, logs, netns_unavailable, rollout_ids, stats
from hosts_kit import config as hosts_config

from trajforge.tasks.sandbox import LABEL

pytestmark = [pytest.mark.docker, pytest.mark.slow]
ENVS, ROLLOUTS = 6, 24  # the spread test: 3 families x 2 seeds x 4 samples, half hosts_kit's default; same checks


def config(tmp, dataset, **over):
    return hosts_config(tmp, dataset, seeds=SEEDS[:2], **over)


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    why = netns_unavailable()
    if why:
        pytest.skip(f"this machine cannot create network namespaces ({why})")
    h = Hosts(tmp_path_factory.mktemp("hosts"))
    h.up()
    try:
        yield h
    finally:
        h.sh("down")


def _verdicts(stats: dict[str, dict]) -> tuple:
    return (stats["rollout"]["episodes"], stats["rollout"]["status"], stats["verify"]["passed"],
            stats["verify"]["tests_passed"], stats["export"]["rows_out"])


def _without_environment_images(*engines: docker.DockerClient) -> None:
    """The hosts are the module's: the other test may have left its environment images (a superset of this one's)
    on both engines, and then nothing would need a pull."""
    for client in engines:
        for image in client.images.list(filters={"label": "trajforge.image=env"}):
            client.images.remove(image.id, force=True)


@pytest.mark.long  # ~3.5 min (two builds); pulls by digest on a second engine: also test_registry.py
def test_a_build_spreads_over_two_engines_pulls_by_digest_and_matches_one_host(hosts, tmp_path):
    a, b = hosts.engine("a"), hosts.engine("b")
    _without_environment_images(a, b)
    with Sandboxes({"a": a, "b": b}) as boxes:
        run = hosts.build(config(tmp_path, "two"))
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:] + logs(hosts.state)
    per_engine = boxes.counts()
    print(f"rollout sandboxes per engine: {per_engine}")
    assert per_engine["a"] > 0 and per_engine["b"] > 0 and sum(per_engine.values()) >= ROLLOUTS, per_engine
    two = stats(tmp_path / "runs", "two")
    assert two["synthesize"]["rows_out"] == ENVS and two["synthesize"]["images_pushed"] == ENVS
    pulled = two["rollout"]["images_pulled"] + two["verify"]["images_pulled"]
    assert pulled >= 1 and two["rollout"]["images_built_here"] == two["verify"]["images_built_here"] == 0
    records = {p.stem: json.loads(p.read_text()) for p in (tmp_path / "runs" / "two" / "images").glob("*.json")}
    assert len(records) == ENVS
    seen_pulled = 0
    for client in (a, b):
        for rec in records.values():
            try:
                image = client.images.get(rec["tag"])
            except docker.errors.ImageNotFound:
                continue
            by_digest = [d for d in image.attrs["RepoDigests"] if d.startswith(f"{HUB}:5000/")]
            assert all(d.endswith("@" + rec["digest"]) for d in by_digest), (rec, by_digest)
            seen_pulled += bool(by_digest)
    assert seen_pulled >= 1
    for client in (a, b):
        assert client.containers.list(all=True, filters={"label": LABEL}) == [], "a sandbox outlived the build"

    one_host = config(tmp_path, "one", **{"dask.address": None, "dask.n_workers": 2,
                                                  "sandbox.registry": None,
                                                  "sandbox.engine": f"unix://{hosts.state}/a/d.sock"})
    run = hosts.build(one_host)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    one = stats(tmp_path / "runs", "one")
    assert _verdicts(two) == _verdicts(one), (_verdicts(two), _verdicts(one))
    assert two["verify"]["passed"] > 0 and two["rollout"]["episodes"] == ROLLOUTS


@pytest.mark.long  # ~3.3 min with its two engines; a Dask worker killed mid-shard stays in make test (test_chaos.py)
def test_a_host_that_dies_mid_rollout_loses_nothing_and_is_reaped_when_back(hosts, tmp_path):
    b = hosts.engine("b")
    build = hosts.build(config(tmp_path, "killed"), background=True)  # 6 x 4, as the spread test
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(build.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 600
        while not b.containers.list(filters={"label": "trajforge.env", "status": "running"}):
            assert build.poll() is None, "".join(output)[-4000:]
            assert time.monotonic() < deadline, "no rollout sandbox ever ran on host b"
            time.sleep(0.1)
        killed = hosts.sh("kill", "b")
        assert killed.returncode == 0, killed.stderr
        assert build.wait(1200) == 0, "".join(output)[-4000:] + logs(hosts.state)
    finally:
        if build.poll() is None:
            build.kill()
        reader.join(10)
    ids = rollout_ids(tmp_path / "runs", "killed")
    assert len(ids) == ROLLOUTS and len(set(ids)) == ROLLOUTS, (len(ids), len(set(ids)))
    committed = stats(tmp_path / "runs", "killed")
    assert committed["verify"]["passed"] > 0 and committed["verify"]["rows_out"] == ROLLOUTS
    assert not {"infra_error", "teacher_error"} & set(committed["rollout"]["status"]), committed["rollout"]["status"]

    back = hosts.sh("revive", "b")
    assert back.returncode == 0, back.stdout + back.stderr + logs(hosts.state)
    b = hosts.engine("b")
    log = (hosts.state / "logs" / "worker-b.log").read_text()
    left = [(c.name, c.status, c.labels.get("trajforge.owner")) for c in b.containers.list(all=True, filters={"label": LABEL})]
    assert left == [], ("the dead host's sandboxes were not reaped", left, log[-2000:])
    assert "reaped" in log and "reaped 0 " not in log, log[-2000:]
