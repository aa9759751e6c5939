"""Who owns a sandbox or a lease (tasks/engine/identity.py): a process counts as the owner only while it runs.
A killed process nobody has waited for (a zombie: its parent died too and PID 1 does not reap it, as on a VM whose
init is a plain agent) is gone, so what it left behind is reaped; a live process is never taken for dead."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from trajforge.tasks.engine.identity import owner_alive, owner_label, process_identity


def test_a_live_owner_is_alive_and_a_reused_pid_is_not_the_owner():
    me = owner_label()
    assert owner_alive(me) is True
    host, pid, started = me.split(":")
    assert owner_alive(f"{host}:{pid}:{float(started) - 10:.2f}") is False  # same pid, an older process
    assert owner_alive(f"another-host:{pid}:{started}") is None  # cannot be told from here


def test_a_killed_owner_left_a_zombie_is_dead():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        label = f"{owner_label().split(':')[0]}:{process_identity(child.pid)}"
        assert owner_alive(label) is True
        child.kill()
        for _ in range(200):  # the kill lands; nobody waits for the child yet: a zombie
            if psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE:
                break
            time.sleep(0.01)
        assert psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE
        assert process_identity(child.pid) is None
        assert owner_alive(label) is False
    finally:
        child.kill()
        child.wait()
