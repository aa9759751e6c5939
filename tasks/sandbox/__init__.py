"""The one sandbox API (hardened containers), what an episode changed read from outside its container
(change walk, system-program layer, checksums), and the reaper of leftover containers. Docker plumbing
only: judging (tests, hack detectors, quality) lives in `tasks/judge`, which imports this package, never
the reverse."""

from .container import ExecResult, Sandbox, docker_client
from .errors import DockerUnavailable, FinalStateUnavailable, SandboxError, SandboxStopped, StateTooLarge
from .reaper import LABEL, reap_here, reap_orphans
from .users import AGENT_UID, USERS, WORKDIR

__all__ = ["AGENT_UID", "USERS", "WORKDIR", "DockerUnavailable", "ExecResult", "FinalStateUnavailable", "Sandbox", "SandboxError",
           "SandboxStopped", "StateTooLarge", "docker_client", "LABEL", "reap_here", "reap_orphans"]
