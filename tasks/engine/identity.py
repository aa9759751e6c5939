"""Which process owns something (a sandbox, a build's lease): `host:pid:process start time`, and
whether that process still runs (operational: no stage fingerprints this module).

Invariant: a pid alone never names an owner. PIDs wrap (32768 here, and every `docker exec` spends
several), so the start time is part of the identity and a newer process with a reused pid is not
the owner.
"""

from __future__ import annotations

import os
import socket


def process_identity(pid: int) -> str | None:
    """`pid:start time` of a live process, or None (`pid:?` when its start time may not be read). A zombie is
    not live: a killed process whose parent died too waits for an init that may never reap it (PID 1 of a
    container or a VM is often not one), and its start time stays readable all that while."""
    import psutil

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return f"{pid}:{proc.create_time():.2f}"
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None
    except psutil.AccessDenied:
        return f"{pid}:?"


def owner_label() -> str:
    """This process, as owners are labelled: `host:pid:start time`."""
    return f"{socket.gethostname()}:{process_identity(os.getpid())}"


def owner_alive(owner: str) -> bool | None:
    """Whether the process an `owner_label()` names still runs: None when that cannot be told from
    here (another host, or no pid in the label). The one liveness check of sandboxes and build leases."""
    host, _, ident = owner.partition(":")
    pid, _, started = ident.partition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return None
    now = process_identity(int(pid))
    return now is not None and (now == ident or now.endswith(":?") or not started)
