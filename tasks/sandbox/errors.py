"""What goes wrong in a sandbox, and whose doing it is: a `SandboxError` is the infrastructure's (the
episode is retried); a `FinalStateUnavailable` is the model's (the episode fails, not retried)."""

from __future__ import annotations


class SandboxError(RuntimeError):
    """The container could not be created or driven: an infrastructure failure, never the model's."""


class DockerUnavailable(SandboxError):
    pass


class OutputTooLarge(SandboxError):
    """A harness exec printed more than it may (a listing is never used cut)."""


class FinalStateUnavailable(SandboxError):
    """The episode's final state cannot be taken, by the model's doing, not an infrastructure fault: the
    episode fails (no retry)."""


class StateTooLarge(FinalStateUnavailable):
    """The work dir outgrew `final_state_limit_bytes`."""


class ChangesTooLarge(FinalStateUnavailable):
    """The agent left more files than the change walk lists (`Sandbox.walk_cap` bytes of records)."""


class WorkDirGone(FinalStateUnavailable):
    """The agent removed its work dir, or put something else than a folder in its place: no final state."""


class StateUnreadable(FinalStateUnavailable):
    """The agent left (part of) a tmpfs work dir that its owner cannot read (e.g. `chmod 000`)."""


class SandboxStopped(SandboxError):
    """The episode's container stopped by its own processes' doing (`stopped.stopped_by_agent`: e.g. a root agent's
    `pkill sleep` or `kill -9 -1` ended the init's only child). The model's doing, never infrastructure: the
    episode ends as `agent_killed_sandbox` and its files are judged in a fresh container."""
