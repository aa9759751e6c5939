"""The one sandbox API (hardened containers), the verifier that runs hidden tests in them, the hack
detectors and quality signals that read what happened, and the reaper of leftover containers."""

from .container import ExecResult, Sandbox, docker_client
from .errors import DockerUnavailable, FinalStateUnavailable, SandboxError, StateTooLarge
from .reaper import LABEL, owner_alive, owner_label, reap_here, reap_orphans
from .users import AGENT_UID, USERS, WORKDIR

__all__ = ["AGENT_UID", "USERS", "WORKDIR", "DockerUnavailable", "ExecResult", "FinalStateUnavailable", "Sandbox", "SandboxError",
           "StateTooLarge", "docker_client", "LABEL", "owner_alive", "owner_label", "reap_here", "reap_orphans"]
