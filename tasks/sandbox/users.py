"""Who runs what in a sandbox: the unprivileged agent user, root, and a root agent's file capabilities."""

from __future__ import annotations

from ...schemas.environment import DEFAULT_WORKDIR

AGENT_UID = 1000
WORKDIR = DEFAULT_WORKDIR
USERS = {"agent": f"{AGENT_UID}:{AGENT_UID}", "root": "0:0"}  # numeric: imported images may lack a passwd entry
# What a root agent keeps (imported tasks assume root's ordinary file powers); never NET_*, SYS_*, MKNOD.
ROOT_FILE_CAPS = ("CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID")
