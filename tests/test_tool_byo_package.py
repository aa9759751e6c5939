"""Bring your own MCP server pinned as a package (`package:` in mcp-env.yaml, tasks/envs/tools/package.py): the
example packages in tests/mcp_packages/ (a wheel built from counters-mcp-python, an `npm pack` of
counters-mcp-node) are served from a loopback registry (tests/mcp_registry.py: a PEP 503 index and a minimal
npm registry on 127.0.0.1), locked on import, installed into the image with no network and validated like
server folders; a loose pin, a missing version and a republished artifact are refused, named."""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from pathlib import Path

import pytest
from mcp_registry import Registry, build_wheel, npm_pack, sdist

from trajforge.schemas.config import SandboxConfig, teacher_config
from trajforge.schemas.environment import EnvSpec
from trajforge.tasks.envs.formats import TaskFormatError, detect, import_task

HERE = Path(__file__).parent / "mcp_packages"
PY_PROJECT, NODE_PROJECT = HERE / "counters-mcp-python", HERE / "counters-mcp-node"
PINNED = {"pip": HERE / "pinned-pip", "npm": HERE / "pinned-npm"}


@pytest.fixture(scope="session")
def example_packages(tmp_path_factory) -> list[Path]:
    """The example packages' wheel and npm tarball, built once per session (each registry reads their bytes)."""
    dist = tmp_path_factory.mktemp("example-packages")
    return [build_wheel(PY_PROJECT, dist), npm_pack(NODE_PROJECT, dist)]


@pytest.fixture
def registry(tmp_path, monkeypatch, tools_wheelhouse, example_packages):
    """The loopback registry with both example packages published, configured as the user's pip index and npm
    registry; the host cache ($TRAJFORGE_CACHE) is the test's own, except the tools layer's wheelhouse (pip, the
    installer; the session's `tools_wheelhouse`, made before the registry is swapped), linked in so nothing is
    downloaded from elsewhere."""
    from trajforge.tasks.envs.tools.layer import lock_text, wheelhouse_dir

    monkeypatch.setenv("TRAJFORGE_CACHE", str(tmp_path / "cache"))
    wheelhouse_dir(lock_text()).parent.mkdir(parents=True)
    wheelhouse_dir(lock_text()).symlink_to(tools_wheelhouse)
    reg = Registry()
    for artifact in example_packages:
        reg.add(artifact)
    for var in ("PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_CONFIG_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # no configured extra index or find-links: loopback only
    monkeypatch.setenv("PIP_INDEX_URL", reg.index_url)
    monkeypatch.setenv("npm_config_registry", reg.url + "/")
    monkeypatch.setenv("npm_config_cache", str(tmp_path / "npm-cache"))
    monkeypatch.setenv("npm_config_userconfig", str(tmp_path / "npmrc"))
    yield reg
    reg.close()


def pinned(tmp_path: Path, manager: str, spec: str) -> Path:
    folder = tmp_path / f"pinned-{manager}-{uuid.uuid4().hex[:6]}"
    shutil.copytree(PINNED[manager], folder)
    meta = folder / "mcp-env.yaml"
    old = "counters-mcp==1.0.0" if manager == "pip" else "counters-mcp@1.0.0"
    meta.write_text(meta.read_text().replace(old, spec))
    return folder


def stamped(manager: str, tmp_path: Path, stamp: str) -> Path:
    """The example package of `manager` built again with `stamp` in it: the same name and version, other bytes."""
    project = tmp_path / f"project-{stamp}"
    shutil.copytree(PY_PROJECT if manager == "pip" else NODE_PROJECT, project)
    if manager == "pip":
        (project / "counters_mcp" / "stamp.py").write_text(f"STAMP = {stamp!r}\n")
        return build_wheel(project, tmp_path / f"dist-{stamp}")
    meta = json.loads((project / "package.json").read_text())
    (project / "package.json").write_text(json.dumps({**meta, "description": f"stamp {stamp}"}))
    return npm_pack(project, tmp_path / f"dist-{stamp}")


def test_a_pinned_package_locks_its_artifacts_into_the_environment(registry):
    env = import_task(PINNED["pip"])
    assert detect(PINNED["pip"]).name == "mcp-server" and env.kind == "tools" and env.source == "mcp-server"
    files = {f.path: f.content for f in env.files}
    assert not any(p.startswith(".tools/server/") for p in files)
    assert json.loads(files[".tools/server.json"]) == {"runtime": "python", "command": ["counters-mcp"],
                                                       "package": "pip:counters-mcp==1.0.0"}
    lock = json.loads(files[".tools/package.lock.json"])
    wheel = registry.files["counters_mcp-1.0.0-py3-none-any.whl"]
    import hashlib

    assert lock["artifacts"] == [{"name": "counters-mcp", "version": "1.0.0", "file": "counters_mcp-1.0.0-py3-none-any.whl",
                                  "sha256": hashlib.sha256(wheel).hexdigest(), "in_tools_layer": False}]
    assert json.loads(env.knobs_json)["package"] == "pip:counters-mcp==1.0.0"
    assert import_task(PINNED["pip"]).env_id == env.env_id  # same pin, same bytes: same environment

    npm = import_task(PINNED["npm"])
    [art] = json.loads(next(f.content for f in npm.files if f.path == ".tools/package.lock.json"))["artifacts"]
    assert (art["name"], art["version"], art["path"], art["bin"]) == ("counters-mcp", "1.0.0",
                                                                      "node_modules/counters-mcp",
                                                                      {"counters-mcp": "server.js"})
    assert art["integrity"].startswith("sha512-") and len(art["sha256"]) == 64


def test_a_dependency_the_tools_layer_holds_is_not_installed_again(registry, tmp_path):
    """A wheel identical to one of the tools layer's (here annotated-types, of the MCP SDK's closure) is locked
    and marked `in_tools_layer`: the image takes it from the layer, the package's own wheel is installed."""
    from trajforge.tasks.envs.tools.layer import lock_text, wheelhouse
    from trajforge.tasks.envs.tools.package import lock_of, requirements

    pin = next(line.split()[0] for line in lock_text().splitlines() if line.startswith("annotated-types=="))
    registry.add(next(wheelhouse().glob("annotated_types-*.whl")))
    project = tmp_path / "project"
    shutil.copytree(PY_PROJECT, project)
    meta = project / "pyproject.toml"
    meta.write_text(meta.read_text().replace('requires-python = ">=3.10"', f'dependencies = ["{pin}"]'))
    registry.replace((wheel := build_wheel(project, tmp_path / "dist2")).name, wheel.read_bytes())
    lock = lock_of(import_task(PINNED["pip"]).files)
    assert [(a["name"], a["in_tools_layer"]) for a in lock["artifacts"]] == [("annotated-types", True),
                                                                              ("counters-mcp", False)]
    assert requirements(lock).startswith("counters-mcp==1.0.0 --hash=sha256:") and "annotated" not in requirements(lock)


def with_a_dependency(registry, tmp_path: Path) -> None:
    """counters-mcp@1.0.0 republished requiring counters-util (which has a postinstall script that fails)."""
    util = tmp_path / "util"
    util.mkdir()
    (util / "package.json").write_text(json.dumps({"name": "counters-util", "version": "2.1.0", "license": "MIT",
                                                   "main": "index.js", "scripts": {"postinstall": "exit 1"}}))
    (util / "index.js").write_text("module.exports = { ready: true };\n")
    registry.add(npm_pack(util, tmp_path / "dist-util"))
    project = tmp_path / "project"
    shutil.copytree(NODE_PROJECT, project)
    meta = json.loads((project / "package.json").read_text())
    (project / "package.json").write_text(json.dumps({**meta, "dependencies": {"counters-util": "^2.0.0"}}))
    server = project / "server.js"  # the server does not start unless node finds its dependency
    server.write_text(server.read_text().replace('"use strict";', '"use strict";\nif (!require("counters-util").ready) '
                                                                    "process.exit(9);", 1))
    registry.replace((tarball := npm_pack(project, tmp_path / "dist2")).name, tarball.read_bytes())
    registry.npm["counters-mcp"]["1.0.0"] = json.loads((project / "package.json").read_text())


def test_an_npm_packages_dependencies_are_locked_with_their_paths(registry, tmp_path):
    """The npm tree as `npm install --package-lock-only` lays it out: every tarball with its path below
    node_modules/ (where the image build unpacks it), integrity and sha256; install scripts listed, not run."""
    with_a_dependency(registry, tmp_path)
    env = import_task(PINNED["npm"])
    lock = json.loads(next(f.content for f in env.files if f.path == ".tools/package.lock.json"))
    assert [(a["name"], a["version"], a["path"]) for a in lock["artifacts"]] == [
        ("counters-mcp", "1.0.0", "node_modules/counters-mcp"), ("counters-util", "2.1.0", "node_modules/counters-util")]
    assert lock["install_scripts"] == ["counters-util"]
    assert json.loads(env.knobs_json)["install_scripts_not_run"] == ["counters-util"]


def test_a_tree_past_its_bound_is_refused_by_name(registry, tmp_path, monkeypatch):
    """An endless dependency chain walked the index for ever (red team round 2): each walk has a bound. Here the
    bounds are lowered so a chain of three (pip) and a package with one dependency (npm) pass them."""
    from trajforge.tasks.envs.tools import package

    registry.add(wheel_requiring(tmp_path, "chain2", []))
    registry.add(wheel_requiring(tmp_path, "chain1", ["chain2"]))
    registry.add(wheel_requiring(tmp_path, "chain0", ["chain1"]))
    monkeypatch.setattr(package, "MAX_WHEELS", 2)
    with pytest.raises(TaskFormatError, match=r"pip package chain0==1.0.0: its tree holds more than 2 distributions"):
        import_task(pinned(tmp_path, "pip", "chain0==1.0.0"))
    with_a_dependency(registry, tmp_path)
    monkeypatch.setattr(package, "MAX_NPM_SPECS", 1)
    with pytest.raises(TaskFormatError, match=r"npm package counters-mcp@1.0.0: its tree asks for more than 1 "):
        import_task(PINNED["npm"])


@pytest.mark.docker
def test_an_npm_dependency_is_unpacked_where_the_server_finds_it(docker_client, registry, tmp_path):
    with_a_dependency(registry, tmp_path)
    v = validate(docker_client, env := import_task(PINNED["npm"]))
    assert v.ok, v.reject  # the failing postinstall never ran; require("counters-util") resolved
    assert json.loads(env.tool_server)["package"] == {"manager": "npm", "name": "counters-mcp", "version": "1.0.0"}


def test_a_republished_artifact_is_another_environment(registry, tmp_path):
    first = import_task(PINNED["pip"]).env_id
    again = stamped("pip", tmp_path, "again")
    registry.replace(again.name, again.read_bytes())
    assert import_task(PINNED["pip"]).env_id != first


@pytest.mark.parametrize("manager, spec, says", [
    ("pip", "counters-mcp>=1.0", "field `package.pip` must pin one exact version"),
    ("pip", "counters-mcp", "field `package.pip` must pin one exact version"),
    ("pip", "counters-mcp @ https://example.org/c.whl", "field `package.pip` must pin one exact version"),
    ("npm", "counters-mcp@^1.0.0", "field `package.npm` must pin one exact version"),
    ("npm", "counters-mcp@latest", "field `package.npm` must pin one exact version"),
    ("npm", "github:someone/counters-mcp", "field `package.npm` must pin one exact version"),
])
def test_a_loose_pin_is_refused_naming_the_field(tmp_path, manager, spec, says):
    with pytest.raises(TaskFormatError, match=says):
        import_task(pinned(tmp_path, manager, spec))


def test_a_missing_version_or_package_is_refused_naming_it_and_the_registry(registry, tmp_path):
    registry.add(sdist("counters-sdist", "2.0.0", tmp_path / "sdist"))
    project = tmp_path / "needs-sdist"  # a wheel whose dependency has only an sdist
    shutil.copytree(PY_PROJECT, project)
    meta = project / "pyproject.toml"
    meta.write_text(meta.read_text().replace('name = "counters-mcp"', 'name = "counters-needs-sdist"').replace(
        'requires-python = ">=3.10"', 'dependencies = ["counters-sdist>=1"]'))
    registry.add(build_wheel(project, tmp_path / "dist-needs"))
    cases = [("pip", "counters-mcp==9.9.9", ["counters-mcp==9.9.9", "version 9.9.9 not found", registry.index_url,
                                               "versions there: 1.0.0"]),
             ("pip", "no-such-mcp==1.0.0", ["no-such-mcp==1.0.0", "not found in the index", registry.index_url]),
             ("pip", "counters-sdist==2.0.0", ["counters-sdist==2.0.0", "only a source distribution",
                                                "counters_sdist-2.0.0.tar.gz", "wheels only"]),
             ("pip", "counters-needs-sdist==1.0.0", ["counters-needs-sdist==1.0.0", "its dependency counters-sdist",
                                                      "only a source distribution", "counters_sdist-2.0.0.tar.gz"]),
             ("npm", "counters-mcp@9.9.9", ["counters-mcp@9.9.9", "version not found", registry.url]),
             ("npm", "no-such-mcp@1.0.0", ["no-such-mcp@1.0.0", "not found in the registry", registry.url])]
    for manager, spec, says in cases:
        with pytest.raises(TaskFormatError) as err:
            import_task(pinned(tmp_path, manager, spec))
        assert "field `package`" in str(err.value) and all(s in str(err.value) for s in says), str(err.value)


def test_an_unreachable_registry_is_named(tmp_path, monkeypatch):
    import socket

    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{port}/simple")
    monkeypatch.setenv("npm_config_registry", f"http://127.0.0.1:{port}/")
    monkeypatch.setenv("npm_config_cache", str(tmp_path / "npm-cache"))
    monkeypatch.setenv("npm_config_fetch_retries", "0")
    for manager, spec in (("pip", "counters-mcp==1.0.0"), ("npm", "counters-mcp@1.0.0")):
        with pytest.raises(TaskFormatError, match=rf"unreachable.*127\.0\.0\.1:{port}"):
            import_task(pinned(tmp_path, manager, spec))


# ---------------------------------------------------------------------------------------------- real Docker
def validate(docker_client, env):
    from trajforge.tasks.envs.images import BuildOptions
    from trajforge.tasks.envs.validator import validate_env

    return validate_env(docker_client, env, SandboxConfig(), "trajforge/base:latest", {}, 20, 30,
                        build=BuildOptions(egress="allowlist"))


@pytest.mark.docker
@pytest.mark.parametrize("manager", ["pip", "npm"])
def test_envs_import_takes_a_pinned_package_and_records_its_tools_and_version(docker_client, registry, tmp_path,
                                                                              manager):
    from typer.testing import CliRunner

    from trajforge.flows.cli import app

    out = tmp_path / "kept.jsonl"
    result = CliRunner().invoke(app, ["envs", "import", str(PINNED[manager]), "--out", str(out), "--state",
                                      str(tmp_path / "journal.jsonl"), "--log-dir", str(tmp_path / "logs")])
    assert result.exit_code == 0, result.output
    [line] = out.read_text().splitlines()
    env = EnvSpec.model_validate_json(line)
    server = json.loads(env.tool_server)
    assert (server["name"], server["version"]) == ("counters-mcp", "1.0.0")
    assert server["package"] == {"manager": manager, "name": "counters-mcp", "version": "1.0.0"}
    assert [t["name"] for t in server["tools"]] == ["list_counters", "set_counter"]
    assert server["tools"][1]["inputSchema"]["properties"]["value"]["type"] == "integer"
    assert not [r for r in registry.requests if not r.startswith(("/simple/", "/files/", "/counters-mcp"))]

    if manager == "pip":  # one oracle episode through the installed server, as for server folders
        from test_tool_harness import episode, passed

        from trajforge.tasks.teachers import ReplayTeacher

        r = episode(docker_client, env, ReplayTeacher(teacher_config({})).session(env, 0))
        assert r.status == "ok" and passed(r) and [s.exit_code for s in r.steps] == [0]
        assert r.protected_changed == [] and r.leftover_processes == 0
        assert [t["function"]["name"] for t in json.loads(r.tools_json)] == ["list_counters", "set_counter", "submit"]


@pytest.mark.docker
@pytest.mark.parametrize("manager", ["pip", "npm"])
def test_a_republished_artifact_is_refused_at_build_naming_it(docker_client, registry, tmp_path, manager):
    """Locked on import, then the registry serves other bytes under the same version: the build (which finds
    no cached copy and downloads again) refuses the artifact by name before any image is built."""
    from trajforge.tasks.envs.tools.layer import wheelhouse_dir
    from trajforge.tasks.envs.tools.package import lock_of, npm_house_dir, requirements

    stamp = uuid.uuid4().hex[:8]  # bytes no earlier run locked (a package layer of its lock would be reused)
    artifact = stamped(manager, tmp_path, stamp)
    registry.replace(artifact.name, artifact.read_bytes())  # the same name and version, this run's bytes
    env = import_task(PINNED[manager])
    lock = lock_of(env.files)
    house = wheelhouse_dir(requirements(lock)) if manager == "pip" else npm_house_dir(lock)
    assert house.exists()
    shutil.rmtree(house)  # another host, or a cleaned cache: the build must download again
    registry.replace(artifact.name, stamped(manager, tmp_path, stamp + "-republished").read_bytes())
    v = validate(docker_client, env)
    assert v.reject is not None and v.build_cause == "artifact_mismatch", v.reject
    assert artifact.name in v.reject.detail and "lock" in v.reject.detail, v.reject.detail


# ------------------------------------------------------------------------------ a hostile npm tarball (red team)
def tarball(dest: Path, manifest: dict, members: list[dict]) -> Path:
    """An npm tarball written by hand: `package/package.json` from `manifest`, then `members` ({name, data} a
    file, {name, dir: True} a folder, {name, link} a symlink, {name, hardlink} a hard link)."""
    import io
    import tarfile

    dest.mkdir(parents=True, exist_ok=True)
    out = dest / f"{manifest['name']}-{manifest['version']}.tgz"
    with tarfile.open(out, "w:gz") as tar:
        for m in [{"name": "package/package.json", "data": json.dumps(manifest)}, *members]:
            info = tarfile.TarInfo(m["name"])
            if "link" in m or "hardlink" in m:
                info.type, info.linkname = (tarfile.SYMTYPE, m["link"]) if "link" in m else (tarfile.LNKTYPE, m["hardlink"])
                tar.addfile(info)
            elif m.get("dir"):
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                data = m["data"].encode()
                info.size, info.mode = len(data), 0o755
                tar.addfile(info, io.BytesIO(data))
    return out


def symlink_escape(registry, tmp_path: Path) -> None:
    """The red team's evilpkg: 1.0.1 depends on 2.0.1 (npm nests it at node_modules/evilpkg/node_modules/evilpkg)
    and its tarball holds `package/node_modules/evilpkg -> /usr/bin`, so unpacking 2.0.1 there wrote /usr/bin/rm."""
    server = (NODE_PROJECT / "server.js").read_text()
    registry.add(tarball(tmp_path / "evil", {"name": "evilpkg", "version": "1.0.1", "bin": {"evilpkg": "server.js"},
                                             "dependencies": {"evilpkg": "2.0.1"}},
                         [{"name": "package/server.js", "data": server}, {"name": "package/node_modules", "dir": True},
                          {"name": "package/node_modules/evilpkg", "link": "/usr/bin"}]))
    registry.add(tarball(tmp_path / "evil", {"name": "evilpkg", "version": "2.0.1"},
                         [{"name": "package/rm", "data": "#!/bin/sh\necho planted\n"}]))


def test_an_npm_tarball_with_a_symlink_is_refused_at_import_naming_it(registry, tmp_path):
    symlink_escape(registry, tmp_path)
    with pytest.raises(TaskFormatError) as err:
        import_task(pinned(tmp_path, "npm", "evilpkg@1.0.1"))
    says = str(err.value)
    assert all(s in says for s in ("npm package evilpkg@1.0.1", "evilpkg-1.0.1.tgz", "package/node_modules/evilpkg",
                                   "a symlink to /usr/bin", "regular files and directories only")), says


@pytest.mark.parametrize("member, says", [
    ({"name": "package/lib", "hardlink": "/etc/shadow"}, "'package/lib' is a hard link to /etc/shadow"),
    ({"name": "package/../../../usr/bin/rm", "data": "x"}, "has a `..` component"),
    ({"name": "/usr/bin/rm", "data": "x"}, "absolute"),
])
def test_an_npm_tarball_with_a_link_or_an_escaping_path_is_refused_at_import(registry, tmp_path, member, says):
    """A dependency's tarball: the message names the dependency, its version and the member."""
    registry.add(tarball(tmp_path / "bad", {"name": "counters-util", "version": "2.1.0"}, [member]))
    project = tmp_path / "project"
    shutil.copytree(NODE_PROJECT, project)
    meta = json.loads((project / "package.json").read_text())
    (project / "package.json").write_text(json.dumps({**meta, "dependencies": {"counters-util": "2.1.0"}}))
    registry.replace((packed := npm_pack(project, tmp_path / "dist2")).name, packed.read_bytes())
    registry.npm["counters-mcp"]["1.0.0"] = json.loads((project / "package.json").read_text())
    with pytest.raises(TaskFormatError) as err:
        import_task(PINNED["npm"])
    assert "its dependency counters-util@2.1.0's tarball counters-util-2.1.0.tgz" in str(err.value), str(err.value)
    assert says in str(err.value), str(err.value)


class _NoImages:
    """A Docker client with no images, whose builds fail the test: the package layer must refuse before one."""

    class images:
        @staticmethod
        def get(tag):
            import docker

            raise docker.errors.ImageNotFound(tag)

        @staticmethod
        def build(**kwargs):
            raise AssertionError("an unsafe artifact reached the image build")


def forged_npm_lock(tmp_path: Path, artifacts: list[tuple[Path, str]]) -> dict:
    """A lock of the given (tarball, path) pairs, its tarballs seeded in the host cache as if locked on import:
    what an environment carrying a forged `.tools/package.lock.json` would give the build."""
    import hashlib

    from trajforge.tasks.envs.tools.package import npm_house_dir

    arts = [{"name": t.name.rsplit("-", 1)[0], "version": t.name.rsplit("-", 1)[1][:-4], "file": t.name,
             "sha256": hashlib.sha256(t.read_bytes()).hexdigest(), "integrity": "", "path": path,
             "bin": {"evilpkg": "server.js"} if path == "node_modules/evilpkg" else {}, "install_script": False}
            for t, path in artifacts]
    lock = {"manager": "npm", "name": "evilpkg", "version": "1.0.1", "artifacts": arts, "install_scripts": []}
    house = npm_house_dir(lock)
    house.mkdir(parents=True)
    for t, _ in artifacts:
        shutil.copyfile(t, house / t.name)
    (house / ".complete").write_text("")
    return lock


def test_the_build_refuses_an_npm_tarball_with_a_symlink_from_a_forged_lock(registry, tmp_path):
    """Defence in depth: a lock that never went through import (forged) still cannot plant files outside
    node_modules: the build unpacks on the host, from the hash-checked bytes, regular files and folders only."""
    from trajforge.tasks.envs.tools.layer import UnsafeArtifact, _package_layer

    symlink_escape(registry, tmp_path)
    lock = forged_npm_lock(tmp_path, [(tmp_path / "evil" / "evilpkg-1.0.1.tgz", "node_modules/evilpkg"),
                                      (tmp_path / "evil" / "evilpkg-2.0.1.tgz",
                                       "node_modules/evilpkg/node_modules/evilpkg")])
    with pytest.raises(UnsafeArtifact) as err:
        _package_layer(_NoImages(), "sha256:layer", lock)
    assert err.value.cause == "artifact_unsafe"
    assert all(s in str(err.value) for s in ("evilpkg-1.0.1.tgz", "evilpkg@1.0.1", "package/node_modules/evilpkg",
                                             "a symlink to /usr/bin")), str(err.value)


@pytest.mark.parametrize("path", ["node_modules/../../usr/bin", "/usr/bin", "usr/bin", "node_modules/x/../../etc"])
def test_the_build_refuses_a_lock_path_outside_node_modules(registry, tmp_path, path):
    from trajforge.tasks.envs.tools.layer import UnsafeArtifact, _package_layer

    good = tarball(tmp_path / "good", {"name": "evilpkg", "version": "1.0.1"}, [{"name": "package/rm", "data": "x"}])
    lock = forged_npm_lock(tmp_path, [(good, "node_modules/evilpkg"), (good, path)])
    with pytest.raises(UnsafeArtifact, match=rf"lock path {re.escape(repr(path))} is not node_modules/"):
        _package_layer(_NoImages(), "sha256:layer", lock)


# ------------------------------------------------------------ dependencies from elsewhere than the index (red team)
@pytest.fixture
def elsewhere(tmp_path):
    """A second loopback server, neither the index nor the registry: a pinned package's tree must not reach it."""
    other = Registry()
    yield other
    other.close()


def wheel_requiring(tmp_path: Path, name: str, deps: list[str], version: str = "1.0.0") -> Path:
    project = tmp_path / f"project-{name}-{version}"
    shutil.copytree(PY_PROJECT, project)
    meta = project / "pyproject.toml"
    meta.write_text(meta.read_text().replace('name = "counters-mcp"', f'name = "{name}"').replace(
        'requires-python = ">=3.10"', f"dependencies = {json.dumps(deps)}").replace(
        'version = "1.0.0"', f'version = "{version}"'))
    return build_wheel(project, tmp_path / f"dist-{name}-{version}")


def test_a_tree_that_needs_backtracking_is_refused_and_nothing_is_fetched_from_elsewhere(registry, elsewhere,
                                                                                        tmp_path):
    """Red team round 2: `top` needs `a` and `b==1.0.0`; `b` needs `a<2`; `a 2.0.0` is clean but `a 1.5.0` needs
    a direct URL. pip's resolver backtracked to `a 1.5.0` and fetched the URL (a git one ran the repository's
    build backend on the host). The walk is the resolution: its first choices disagree, so it is refused."""
    elsewhere.add(wheel_requiring(tmp_path, "evil", []))
    registry.add(wheel_requiring(tmp_path, "a", [], "2.0.0"))
    registry.add(wheel_requiring(tmp_path, "a", [f"evil @ {elsewhere.url}/files/evil-1.0.0-py3-none-any.whl"], "1.5.0"))
    registry.add(wheel_requiring(tmp_path, "b", ["a<2"]))
    registry.add(wheel_requiring(tmp_path, "top", ["a", "b==1.0.0"]))
    with pytest.raises(TaskFormatError) as err:
        import_task(pinned(tmp_path, "pip", "top==1.0.0"))
    says = str(err.value)
    assert "b==1.0.0 requires 'a<2', but the tree's first choice is a==2.0.0" in says and "backtracking" in says, says
    assert elsewhere.requests == []


@pytest.mark.parametrize("direct", ["second @ {other}/files/second-1.0.0-py3-none-any.whl",
                                    "second @ file:///etc/hostname", "second[x] @ git+{other}/second.git ; python_version >= '3'"])
def test_a_pip_dependency_by_direct_url_is_refused_before_it_is_fetched(registry, elsewhere, tmp_path, direct):
    """The red team's urldep: a wheel in the index requiring `second @ http://...` (PEP 508 direct URL) made the
    host fetch from another server. The pin's tree is walked through the index's wheels' METADATA first: the
    requirement is refused, naming the wheel and the spec, and the other server sees no request."""
    elsewhere.add(wheel_requiring(tmp_path, "second", []))
    spec = direct.format(other=elsewhere.url)
    registry.add(wheel_requiring(tmp_path, "urldep", [spec]))
    registry.add(wheel_requiring(tmp_path, "counters-app", ["urldep>=1"]))  # the URL one level down
    for pin, who in (("urldep==1.0.0", "it requires"), ("counters-app==1.0.0", "its dependency urldep==1.0.0 requires")):
        with pytest.raises(TaskFormatError) as err:
            import_task(pinned(tmp_path, "pip", pin))
        says = str(err.value)
        assert all(s in says for s in (f"pip package {pin}", f"{who} {spec!r}", "a direct URL", registry.index_url)), says
    assert elsewhere.requests == []


def npm_requiring(registry, tmp_path: Path, name: str, deps: dict) -> None:
    server = (NODE_PROJECT / "server.js").read_text()
    registry.add(tarball(tmp_path / f"npm-{name}", {"name": name, "version": "1.0.3", "bin": {name: "server.js"},
                                                    "dependencies": deps}, [{"name": "package/server.js", "data": server}]))


@pytest.mark.parametrize("spec", ["{other}/files/second-1.0.0.tgz", "file:{secret}", "file:../second",
                                  "link:/etc", "git+{other}/second.git", "github:someone/second", "someone/second",
                                  "npm:second@{other}/files/second-1.0.0.tgz"])
def test_an_npm_dependency_not_from_the_registry_is_refused_before_it_is_fetched(registry, elsewhere, tmp_path, spec):
    """The red team's evilpkg@1.0.3: dependencies `http://...` and `file:/host/path` made npm fetch from another
    server and read a host file while locking. Every manifest in the tree is read from the registry first: a
    spec that is not a registry version or range is refused naming the package and the spec, before npm runs."""
    secret = tmp_path / "hostsecret.tgz"
    secret.write_bytes(b"not for the package")
    elsewhere.add(tarball(tmp_path / "other", {"name": "second", "version": "1.0.0"}, []))
    spec = spec.format(other=elsewhere.url, secret=secret)
    npm_requiring(registry, tmp_path, "evilpkg", {"second": spec})
    npm_requiring(registry, tmp_path, "evilapp", {"evilpkg": "^1.0.0"})  # the spec one level down
    for pin, who in (("evilpkg@1.0.3", "it depends on"), ("evilapp@1.0.3", "its dependency evilpkg@1.0.3 depends on")):
        with pytest.raises(TaskFormatError) as err:
            import_task(pinned(tmp_path, "npm", pin))
        says = str(err.value)
        assert all(s in says for s in (f"npm package {pin}", f"{who} second: {spec!r}", "not a version or range",
                                       registry.url)), says
    assert elsewhere.requests == []


def test_an_npm_tarball_served_from_elsewhere_is_refused_naming_it(registry, elsewhere, tmp_path):
    """A registry manifest whose `dist.tarball` is on another server: the lock npm writes is checked, every
    `resolved` must be a tarball of the registry, before any tarball is downloaded (`npm pack`)."""
    with_a_dependency(registry, tmp_path)
    elsewhere.add(packed := next((tmp_path / "dist-util").glob("*.tgz")))
    registry.tarball_urls[("counters-util", "2.1.0")] = f"{elsewhere.url}/files/{packed.name}"
    with pytest.raises(TaskFormatError) as err:
        import_task(PINNED["npm"])
    says = str(err.value)
    assert all(s in says for s in ("npm package counters-mcp@1.0.0", "counters-util@2.1.0",
                                   f"{elsewhere.url}/files/{packed.name}", "not a tarball of the registry")), says
    assert not [r for r in elsewhere.requests if r.startswith("/files/")]
