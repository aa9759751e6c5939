"""trajforge's build network: where imported Dockerfiles build under `synthesize.build.egress: allowlist`.

An `internal` Docker bridge network (`NETWORK`, bridge interface `BRIDGE`, a documentation subnet,
`synthesize.build.subnet`) has no route out. The host side of it, the gateway address, is the host
itself, so a firewall of trajforge's own keeps the rest of the host out: on the bridge interface, the
host accepts only TCP to the egress proxy's port on the gateway (one rule per proxy, marked with the
owning process id; stale ones are removed when the next proxy starts) and rejects everything else at
once (a TCP reset, an ICMP error: a build fails fast, never hangs); nothing from the bridge is forwarded;
IPv6 from the bridge is dropped. The proxy (`egress.EgressProxy`, one per process, started on first use,
stopped at exit) is the only way out. The Docker engine and this process must share a network namespace
(a local engine): the firewall and the proxy live where the bridge is.
"""

from __future__ import annotations

import atexit
import ipaddress
import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Any

import docker
import docker.errors

from ..sandbox import DockerUnavailable
from .egress import EgressProxy

NETWORK = "trajforge-build"
BRIDGE = "tf-build0"
CHAIN = "TF-BUILD-EGRESS"
LABEL = {"trajforge.network": "build"}
_LOCK = threading.Lock()
_PROXIES: dict[tuple[str, str], "Gate"] = {}


class EgressUnavailable(DockerUnavailable):
    """The build network or its firewall cannot be set up here (no iptables, not root, a subnet in use)."""


@dataclass
class Gate:
    """The build network as this process uses it: its name, gateway, and the proxy serving on the gateway."""

    network: str
    gateway: str
    subnet: str
    proxy: EgressProxy


def ensure_network(client: docker.DockerClient, subnet: str) -> tuple[str, str]:
    """(network name, gateway address) of the build network, created if absent. A network of that name
    with another subnet, or not internal, is an error naming it (never silently used). Safe when processes of one
    host create it at once (a build's workers, validators in parallel): a create refused because a peer's create
    won (the engine says "already exists" or, checking the address pool first, "Pool overlaps") uses the peer's."""
    net = ipaddress.ip_network(subnet)
    gateway = str(next(net.hosts()))
    try:
        found = client.networks.get(NETWORK)
    except docker.errors.NotFound:
        pool = docker.types.IPAMPool(subnet=str(net), gateway=gateway)
        try:
            found = client.networks.create(
                NETWORK, driver="bridge", internal=True, labels=LABEL, ipam=docker.types.IPAMConfig(pool_configs=[pool]),
                options={"com.docker.network.bridge.name": BRIDGE,
                         "com.docker.network.bridge.enable_ip_masquerade": "false"})
        except docker.errors.APIError as err:
            found = _peers(client)  # a peer created it meanwhile: checked like any found below
            if found is None:
                raise EgressUnavailable(f"cannot create the build network {NETWORK} on {subnet} "
                                        f"(synthesize.build.subnet): {err}") from None
    attrs = found.attrs
    configs = (attrs.get("IPAM") or {}).get("Config") or []
    if not attrs.get("Internal") or not configs or configs[0].get("Subnet") != str(net):
        have = configs[0].get("Subnet") if configs else None
        raise EgressUnavailable(f"Docker network {NETWORK} exists with subnet {have} (internal: {attrs.get('Internal')}); "
                                f"synthesize.build.subnet is {subnet}: remove the network (`docker network rm "
                                f"{NETWORK}`) or set the subnet it has")
    return NETWORK, configs[0].get("Gateway") or gateway


def _peers(client: docker.DockerClient, wait_s: float = 10.0) -> Any:
    """The build network a peer's create made, or None. The engine reserves the address pool before the network
    can be read: a create refused for the pool may find the winner's network only a moment later."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return client.networks.get(NETWORK)
        except docker.errors.NotFound:
            if time.monotonic() > deadline:
                return None
            time.sleep(0.1)


def _ipt(tool: str, *args: str, check: bool = True) -> bool:
    proc = subprocess.run([tool, "-w", *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise EgressUnavailable(f"{tool} {' '.join(args)} failed: {proc.stderr.strip()} (the build network's "
                                "firewall needs root and iptables, like the Docker engine)")
    return proc.returncode == 0


def _ensure(tool: str, table_chain: tuple[str, ...], rule: tuple[str, ...], first: bool = True) -> None:
    if not _ipt(tool, "-C", *table_chain, *rule, check=False):
        _ipt(tool, "-I" if first else "-A", *table_chain, *((("1",) if first else ())), *rule)


def firewall(gateway: str) -> None:
    """The host's rules for the bridge (idempotent): jump from INPUT to `CHAIN`, which ends in rejects;
    nothing forwarded to or from the bridge; IPv6 from it dropped."""
    if shutil.which("iptables") is None:
        raise EgressUnavailable("iptables is not installed: the build network's firewall needs it "
                                "(or set synthesize.build.egress: none)")
    _ipt("iptables", "-N", CHAIN, check=False)
    _ensure("iptables", ("INPUT",), ("-i", BRIDGE, "-j", CHAIN))
    _ensure("iptables", (CHAIN,), ("-p", "tcp", "-j", "REJECT", "--reject-with", "tcp-reset"), first=False)
    _ensure("iptables", (CHAIN,), ("-j", "REJECT", "--reject-with", "icmp-admin-prohibited"), first=False)
    _ensure("iptables", ("FORWARD",), ("-i", BRIDGE, "-j", "REJECT", "--reject-with", "icmp-admin-prohibited"))
    _ensure("iptables", ("FORWARD",), ("-o", BRIDGE, "-j", "DROP"))
    if shutil.which("ip6tables"):
        _ensure("ip6tables", ("INPUT",), ("-i", BRIDGE, "-j", "DROP"))
        _ensure("ip6tables", ("FORWARD",), ("-i", BRIDGE, "-j", "DROP"))


def _accept_rule(gateway: str, port: int, pid: int) -> tuple[str, ...]:
    return ("-p", "tcp", "-d", gateway, "--dport", str(port), "-m", "comment", "--comment",
            f"trajforge-egress-pid-{pid}", "-j", "ACCEPT")


def _drop_stale() -> None:
    """Remove accept rules of proxies whose process is gone (killed before its exit handler ran)."""
    proc = subprocess.run(["iptables", "-w", "-S", CHAIN], capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if "trajforge-egress-pid-" not in line or not line.startswith(f"-A {CHAIN} "):
            continue
        pid = int(line.split("trajforge-egress-pid-")[1].split()[0].strip('"'))
        if pid != os.getpid() and not os.path.exists(f"/proc/{pid}"):
            _ipt("iptables", "-D", *line.split()[1:], check=False)


def gate(client: docker.DockerClient, subnet: str) -> Gate:
    """This process's gate to the build network on `client`'s engine: the network, the firewall and a
    started proxy on the gateway, set up on first use and kept until the process exits."""
    with _LOCK:
        key = (client.api.base_url, subnet)
        if key in _PROXIES:
            return _PROXIES[key]
        network, gateway = ensure_network(client, subnet)
        firewall(gateway)
        _drop_stale()
        try:
            proxy = EgressProxy(gateway, forbidden=[subnet]).start()
        except OSError as err:  # the gateway is not an address here: the engine lives in another namespace
            raise EgressUnavailable(f"{err}; the build network's gateway must be an address of this process's "
                                    "network namespace (a local engine), else set synthesize.build.egress") from None
        rule = _accept_rule(gateway, proxy.port, os.getpid())
        _ipt("iptables", "-I", CHAIN, "1", *rule)

        def close() -> None:
            proxy.stop()
            _ipt("iptables", "-D", CHAIN, *rule, check=False)

        atexit.register(close)
        _PROXIES[key] = Gate(network, gateway, subnet, proxy)
        return _PROXIES[key]
