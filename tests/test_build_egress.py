"""Imported builds reach nothing of the host (issue 46): the egress proxy's rules, the config, and real builds on
trajforge's build network.

Traffic stays on this machine: listeners on loopback and on the build network's gateway (the network the
test's builds create); the one build that installs packages reaches Debian's mirror and PyPI only through
the proxy (the allowed path).
"""

from __future__ import annotations

import http.server
import socket
import threading
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from helpers import run_cli

from trajforge.schemas.config import DEFAULT_EGRESS_ALLOWLIST, ConfigError, SynthesizeConfig, fingerprint_view
from trajforge.tasks.envs.egress import EgressProxy, allowed, forbidden_reason

CA = "/etc/ssl/certs/ca-certificates.crt"


# ---------------------------------------------------------------------------------------------- the build network
@pytest.mark.docker
def test_processes_that_create_the_build_network_at_once_all_get_it(docker_client, monkeypatch):
    """Seen when the real project's environments were validated in parallel on a fresh engine: the engine refuses all
    but the first create ("Pool overlaps with other one on this address space"), and each loser must use the
    winner's network, never fail its build. (A network and bridge of this test's own, on a subnet of its own.)"""
    from trajforge.tasks.envs import buildnet

    name = f"tf-race-{uuid.uuid4().hex[:6]}"
    monkeypatch.setattr(buildnet, "NETWORK", name)
    monkeypatch.setattr(buildnet, "BRIDGE", f"tfr{uuid.uuid4().hex[:8]}")
    start = threading.Barrier(6)
    got, errors = [], []

    def create() -> None:
        import docker

        client = docker.from_env()
        start.wait()
        try:
            got.append(buildnet.ensure_network(client, "198.51.100.192/28"))
        except Exception as err:  # (kept for the assertion: a lost race must not be an error)
            errors.append(err)

    threads = [threading.Thread(target=create) for _ in range(6)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert errors == [] and got == [(name, "198.51.100.193")] * 6, errors
    finally:
        for net in docker_client.networks.list(names=[name]):
            net.remove()


# ---------------------------------------------------------------------------------------------- the proxy's rules
def test_allowlist_patterns_and_ports():
    assert allowed("deb.debian.org", 80, DEFAULT_EGRESS_ALLOWLIST)
    assert allowed("DEB.debian.org.", 443, DEFAULT_EGRESS_ALLOWLIST)
    assert allowed("ftp.de.debian.org", 80, DEFAULT_EGRESS_ALLOWLIST)
    assert not allowed("deb.debian.org", 22, DEFAULT_EGRESS_ALLOWLIST)  # a pattern without a port: 80 and 443
    assert not allowed("evil.org", 443, DEFAULT_EGRESS_ALLOWLIST)
    assert not allowed("pypi.org.evil.org", 443, DEFAULT_EGRESS_ALLOWLIST)
    assert not allowed("127.0.0.1", 80, DEFAULT_EGRESS_ALLOWLIST)
    assert allowed("mirror.example", 8080, ["mirror.example:8080"]) and not allowed("mirror.example", 80, ["mirror.example:8080"])


def test_forbidden_addresses():
    own = {"192.0.2.2"}
    for address, why in [("127.0.0.1", "loopback"), ("127.8.9.1", "loopback"), ("::1", "loopback"),
                         ("::ffff:127.0.0.1", "loopback"), ("10.1.2.3", "private"), ("172.20.0.1", "private"),
                         ("192.168.1.1", "private"), ("100.64.0.1", "private"), ("fd00::2", "private"),
                         ("169.254.169.254", "link-local"), ("fe80::1", "link-local"), ("0.0.0.0", "not a unicast"),
                         ("224.0.0.1", "not a unicast"), ("192.0.2.2", "own address"),
                         ("198.51.100.230", "private (198.51.100.224/27)")]:
        reason = forbidden_reason(address, own, [__import__("ipaddress").ip_network("198.51.100.224/27")])
        assert reason and why in reason, (address, reason)
    assert forbidden_reason("151.101.2.132", own) is None
    # documentation ranges are not refused as such: a transparent package proxy may sit in one
    assert forbidden_reason("203.0.113.80", own) is None


class _Upstream(http.server.BaseHTTPRequestHandler):
    seen: list[str] = []

    def do_GET(self):  # noqa: N802
        _Upstream.seen.append(f"{self.path} host={self.headers.get('Host')} auth={self.headers.get('Proxy-Authorization')}")
        body = b"mirror says hi\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def upstream():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


def _opener(proxy_url: str) -> urllib.request.OpenerDirector:
    return urllib.request.build_opener(urllib.request.ProxyHandler({"http": proxy_url, "https": proxy_url}))


def test_proxy_forwards_allowed_names_and_records_refusals(upstream):
    """Forwarding itself (a stand-in mirror on loopback, admitted by the test's own screen), then the real
    screen: a name that resolves to loopback is refused and recorded, a name off the list too, a request
    without a build token gets 407 and no record."""
    async def resolve(host, port):
        return {"mirror.test": ["127.0.0.1"], "rebind.test": ["127.0.0.1"]}[host]

    proxy = EgressProxy("127.0.0.1", resolver=resolve, screen=lambda a: None).start()
    try:
        token = proxy.open_build([f"mirror.test:{upstream}"])
        body = _opener(proxy.url(token)).open(f"http://mirror.test:{upstream}/dists/x?y=1", timeout=10).read()
        assert body == b"mirror says hi\n"
        assert _Upstream.seen[-1].startswith("/dists/x?y=1 host=mirror.test") and "auth=None" in _Upstream.seen[-1]
        with pytest.raises(urllib.error.HTTPError) as err:
            _opener(proxy.url(token)).open("http://evil.test/", timeout=10)
        assert err.value.code == 403
        assert [str(r) for r in proxy.close_build(token)] == ["evil.test:80 (not on the allowlist)"]
    finally:
        proxy.stop()
    proxy = EgressProxy("127.0.0.1", resolver=resolve).start()  # the real screen: loopback is the host
    try:
        token = proxy.open_build([f"rebind.test:{upstream}"])
        with pytest.raises(urllib.error.HTTPError) as err:
            _opener(proxy.url(token)).open(f"http://rebind.test:{upstream}/", timeout=10)
        assert err.value.code == 403
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as s:  # CONNECT, no token
            s.sendall(b"CONNECT rebind.test:443 HTTP/1.1\r\nHost: rebind.test:443\r\n\r\n")
            assert s.recv(100).startswith(b"HTTP/1.1 407")
        refused = proxy.close_build(token)
        assert [(r.host, r.port) for r in refused] == [("rebind.test", upstream)]
        assert "resolves to 127.0.0.1, loopback" in refused[0].reason
    finally:
        proxy.stop()


def test_what_the_engine_fetches_itself_is_refused():
    """`ADD <url>` and registry images not present locally are fetched by dockerd on the host's network:
    refused by name before any build (a registry on the host's loopback is the host)."""
    import docker.errors

    from trajforge.tasks.envs.images import engine_fetches, registry_host

    class Images:
        def get(self, name):
            if name == "present.example/ok:1":
                return object()
            raise docker.errors.ImageNotFound(name)

    client = type("Client", (), {"images": Images()})()
    dockerfile = ("FROM sha256:abc AS build\nFROM localhost:5000/secrets:latest\nFROM present.example/ok:1\n"
                  "FROM debian:bookworm\nCOPY --from=build /x /x\nCOPY --chown=0:0 --from=127.0.0.1:5000/img /a /a\n"
                  "ADD http://127.0.0.1:4200/api/admin /tmp/a\nADD --chown=0:0 https://example.org/f.tgz /tmp/\n"
                  "ADD local.txt /tmp/\n")
    got = [(r.host, r.port) for r in engine_fetches(client, dockerfile)]
    assert got == [("127.0.0.1", 4200), ("example.org", 443), ("localhost", 5000), ("127.0.0.1", 5000)]
    assert registry_host("debian:bookworm") is None and registry_host("library/debian") is None
    assert registry_host("ghcr.io/org/img:1") == ("ghcr.io", 443)


def test_a_tunnel_and_a_request_reach_only_the_host_they_named(upstream):
    """Fronting: a CONNECT tunnel whose TLS ClientHello names another server is cut and recorded, one naming the
    CONNECT host goes through as it came; a plain request's Host header is the checked host, whatever the
    client wrote."""
    import ssl

    async def resolve(host, port):
        return ["127.0.0.1"]

    got: list[bytes] = []
    raw = socket.create_server(("127.0.0.1", 0))

    def accept():
        while True:
            try:
                conn, _ = raw.accept()
            except OSError:
                return
            got.append(conn.recv(5))
            conn.close()
    threading.Thread(target=accept, daemon=True).start()
    tls_port = raw.getsockname()[1]
    proxy = EgressProxy("127.0.0.1", resolver=resolve, screen=lambda a: None).start()
    try:
        token = proxy.open_build([f"mirror.test:{tls_port}", f"mirror.test:{upstream}"])
        auth = "Proxy-Authorization: Basic " + __import__("base64").b64encode(f"{token}:x".encode()).decode()
        for sni in ("evil.test", "mirror.test"):
            with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as s:
                s.sendall(f"CONNECT mirror.test:{tls_port} HTTP/1.1\r\n{auth}\r\n\r\n".encode())
                assert s.recv(100).startswith(b"HTTP/1.1 200")
                ctx = ssl.create_default_context()
                with pytest.raises((ssl.SSLError, OSError)):
                    ctx.wrap_socket(s, server_hostname=sni).do_handshake()
        assert [g[:1] for g in got] == [b"", b"\x16"]  # the fronting hello never reached the upstream; the other did
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as s:
            s.sendall(f"GET http://mirror.test:{upstream}/a HTTP/1.1\r\nHost: evil.test\r\n{auth}\r\n\r\n".encode())
            answer = b"".join(iter(lambda: s.recv(4096), b""))  # the proxy closes after one request
            assert b"mirror says hi" in answer
        assert _Upstream.seen[-1].startswith(f"/a host=mirror.test:{upstream}")
        assert [(r.host, r.reason) for r in proxy.close_build(token)] == [
            ("mirror.test", "TLS server name evil.test is not the CONNECT host")]
    finally:
        proxy.stop()
        raw.close()


# --------------------------------------------------------------------------------------------------- the config
def test_egress_config_and_old_network_values():
    assert SynthesizeConfig(imports=["x"]).build.egress == "allowlist"
    assert SynthesizeConfig(imports=["x"], build={"network": "imports"}).build.egress == "allowlist"
    assert SynthesizeConfig(imports=["x"], build={"network": "none"}).build.egress == "none"
    s = SynthesizeConfig(imports=["x"], build={"allowlist_extra": ["mirror.example:8080"], "subnet": "198.51.100.0/28"})
    assert s.build.allowed_hosts()[-1] == "mirror.example:8080" and "pypi.org" in s.build.allowed_hosts()
    assert "subnet" not in fingerprint_view(s.build) and fingerprint_view(s.build)["egress"] == "allowlist"
    for bad, named in [({"network": "bridge"}, "synthesize.build.network"),
                       ({"network": "none", "egress": "host"}, "contradicts"),
                       ({"subnet": "198.51.100.0/31"}, "synthesize.build.subnet"),
                       ({"egress": "open"}, "egress")]:
        with pytest.raises(ValueError, match=named):
            SynthesizeConfig(imports=["x"], build=bad)


def test_host_egress_warns(capsys, monkeypatch):
    from trajforge.tasks.envs import images

    monkeypatch.setattr(images, "_HOST_WARNED", [])
    options = images.BuildOptions.from_config(SynthesizeConfig(imports=["x"], build={"egress": "host"}).build)
    assert options.egress == "host" and "reaches every service on this host" in capsys.readouterr().err
    quiet = images.BuildOptions.from_config(SynthesizeConfig(imports=["x"]).build)
    assert quiet.egress == "allowlist" and "pypi.org" in quiet.allowlist and capsys.readouterr().err == ""


def test_bad_egress_in_a_config_file_names_the_field(tmp_path):
    from trajforge.schemas.config import load_config

    path = tmp_path / "c.yaml"
    path.write_text("dataset: d\nsynthesize:\n  imports: [x]\n  build: {network: bridge}\n")
    with pytest.raises(ConfigError, match="synthesize.build.network"):
        load_config(path)


# ------------------------------------------------------------------------------------------- real builds (Docker)
def _listener(host: str, port: int = 0) -> tuple[socket.socket, list]:
    """A TCP listener that records every connection it accepts (it must record none)."""
    try:
        s = socket.create_server((host, port))
    except OSError:  # the canonical port is taken on this machine: any port shows the same
        s = socket.create_server((host, 0))
    accepted: list = []

    def serve():
        while True:
            try:
                conn, peer = s.accept()
            except OSError:
                return
            accepted.append(peer)
            conn.close()
    threading.Thread(target=serve, daemon=True).start()
    return s, accepted


def _task(root: Path, name: str, run: str) -> Path:
    task = root / name
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "instruction.md").write_text(f"Write done to /app/out.txt ({name}).\n")
    (task / "task.toml").write_text('version = "1.0"\n[verifier]\ntimeout_sec = 60.0\n'
                                    '[environment]\nbuild_timeout_sec = 300.0\n')
    (task / "environment" / "Dockerfile").write_text(f"FROM debian:bookworm\nWORKDIR /app\n{run}\n")
    (task / "tests" / "test.sh").write_text(
        "#!/bin/bash\nmkdir -p /logs/verifier\n"
        "if [ \"$(cat /app/out.txt)\" = done ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n")
    (task / "solution").mkdir()
    (task / "solution" / "solve.sh").write_text("#!/bin/bash\necho done > /app/out.txt\n")
    return task


@pytest.mark.docker
def test_imported_builds_reach_nothing_of_the_host(tmp_path, docker_client, monkeypatch):
    """Planted tasks whose RUN steps try the host's loopback, a Prefect API stand-in, a local registry port and the
    teacher's port (allowlisted by name, resolving to loopback): each fails `build_egress_refused` naming what it
    tried, also when the step swallows the error. A step that skips the proxy and connects straight to the
    gateway (the host, as the build network sees it) is rejected by the firewall: the listener there accepts
    nothing."""
    from trajforge.tasks.envs import buildnet
    from trajforge.tasks.envs.formats import import_task
    from trajforge.tasks.envs.images import BuildOptions, ImageBuildError, base_image_id, ensure_image, image_tag

    monkeypatch.setenv("TRAJFORGE_BLOB_STORE", str(tmp_path / "blobs"))
    subnet = "198.51.100.224/27"
    gate = buildnet.gate(docker_client, subnet)
    loop_l, loop_seen = _listener("127.0.0.1")
    prefect_l, prefect_seen = _listener("127.0.0.1", 4200)
    registry_l, registry_seen = _listener("127.0.0.1", 5000)
    teacher_l, teacher_seen = _listener("127.0.0.1", 8000)
    gw_l, gw_seen = _listener(gate.gateway)  # a host service the build network could address directly
    ports = {n: s.getsockname()[1] for n, s in [("loop", loop_l), ("prefect", prefect_l), ("registry", registry_l),
                                                 ("teacher", teacher_l), ("gw", gw_l)]}
    get = "import urllib.request as u; u.urlopen(\"{url}\", timeout=30).read()"
    planted = {
        "loopback": (get.format(url=f"http://127.0.0.1:{ports['loop']}/secret"), ("127.0.0.1", ports["loop"])),
        "prefect-api": (get.format(url=f"http://localhost:{ports['prefect']}/api/deployments/filter"),
                        ("localhost", ports["prefect"])),
        "registry": (get.format(url=f"https://127.0.0.1:{ports['registry']}/v2/_catalog"),
                     ("127.0.0.1", ports["registry"])),
        # on the allowlist by name, but the name is the host's loopback; the step even swallows the error
        "teacher": (get.format(url=f"http://localhost:{ports['teacher']}/v1/models") + "' || echo 'ignored",
                    ("localhost", ports["teacher"])),
    }
    allowlist = (*DEFAULT_EGRESS_ALLOWLIST, f"localhost:{ports['teacher']}")
    options = BuildOptions(egress="allowlist", allowlist=allowlist, subnet=subnet, ca_bundle=CA, timeout_s=300)
    try:
        for name, (code, (host, port)) in planted.items():
            env = import_task(_task(tmp_path, name, f"RUN python3 -c '{code}'"))
            with pytest.raises(ImageBuildError) as err:
                ensure_image(docker_client, "trajforge/base:latest", env, {"debian:*": "{base}"}, options=options)
            assert err.value.cause == "build_egress_refused", (name, str(err.value)[:1500])
            assert (host, port) in [(r.host, r.port) for r in err.value.refusals], (name, err.value.refusals)
            assert f"{host}:{port}" in str(err.value).splitlines()[0]
            tag = image_tag(base_image_id(docker_client, "trajforge/base:latest"), env, {"debian:*": "{base}"})
            assert not docker_client.images.list(name=tag), name  # never kept, not even when it built
        # straight to the gateway, past the proxy: reset at once by the host's firewall
        code = f"import socket; socket.create_connection((\"{gate.gateway}\", {ports['gw']}), timeout=30)"
        env = import_task(_task(tmp_path, "direct", f"RUN python3 -c '{code}'"))
        with pytest.raises(ImageBuildError) as err:
            ensure_image(docker_client, "trajforge/base:latest", env, {"debian:*": "{base}"}, options=options)
        assert "ConnectionRefusedError" in err.value.log_tail and err.value.cause != "build_timeout", err.value.log_tail
    finally:
        for s in (loop_l, prefect_l, registry_l, teacher_l, gw_l):
            s.close()
    assert loop_seen == prefect_seen == registry_seen == teacher_seen == gw_seen == []


@pytest.mark.docker
def test_apt_and_pip_through_the_allowed_path_build_and_validate(tmp_path):
    """A task installing one small Debian package and one small PyPI package through the proxy imports, builds
    and validates (`envs import`, the default policy); a task trying the host's loopback in the same folder is
    rejected `build_egress_refused` with the host and port, and the import goes on."""
    corpus = tmp_path / "corpus"
    _task(corpus, "apt-and-pip", f"RUN echo {uuid.uuid4().hex} > /etc/nonce\n"  # a new image: no layer cache
          "RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "
          "python3-pip bc >/dev/null && rm -rf /var/lib/apt/lists/*\n"
          "RUN pip install -q --no-cache-dir --break-system-packages six==1.16.0 && python3 -c 'import six' "
          "&& echo 2+2 | bc")
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
        _task(corpus, "hostile", "RUN python3 -c 'import urllib.request as u; "
                                 f"u.urlopen(\"http://127.0.0.1:{port}/api/admin\", timeout=30)'")
        out = run_cli("envs", "import", str(corpus), "--fresh", "--out", str(tmp_path / "envs.jsonl"), cwd=tmp_path,
                      timeout=900)
    text = out.stdout + out.stderr
    assert "build_egress_refused" in text and f"127.0.0.1:{port}" in text, text[-3000:]
    from trajforge.schemas.environment import EnvSpec

    kept = [EnvSpec.model_validate_json(line) for line in (tmp_path / "envs.jsonl").read_text().splitlines()]
    assert len(kept) == 1, text[-3000:]
    assert kept[0].build_egress == "allowlist" and "apt-and-pip" in kept[0].env_id, kept[0].env_id


@pytest.mark.docker
def test_a_build_network_with_another_subnet_is_named_not_used(docker_client):
    """The network `trajforge-build` exists (the default subnet); asking for another subnet is an error naming
    `synthesize.build.subnet` and the way out, never a build on a network of unknown shape."""
    from trajforge.tasks.envs import buildnet

    buildnet.ensure_network(docker_client, "198.51.100.224/27")
    with pytest.raises(buildnet.EgressUnavailable, match=r"synthesize.build.subnet is 198.51.100.192/28"):
        buildnet.gate(docker_client, "198.51.100.192/28")
    net = docker_client.networks.get(buildnet.NETWORK).attrs
    assert net["Internal"] and net["IPAM"]["Config"][0]["Subnet"] == "198.51.100.224/27"
