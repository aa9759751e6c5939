"""An environment: what an agent works in. Image + instruction + hidden tests + reference solution.

Sources: procedural families (`procedural:<family>`), LLM synthesis (`llm:<theme>`) and imported task
folders (`harbor`, `terminal-bench`). All go through the same validator.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
from typing import Literal

from pydantic import Field, field_validator

from .common import FileSpec, Record

DEFAULT_WORKDIR = "/home/agent/work"
WORKDIR_CHARS = re.compile(r"^/[A-Za-z0-9._/+-]+$")
# A work dir the agent owns may not be (or sit inside) a place the verifier's interpreter comes from.
SYSTEM_DIRS = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/run", "/sbin",
               "/sys", "/usr", "/var/lib")


def check_workdir(path: str) -> str:
    """An absolute, normalised path of plain characters that is not a system directory (nor inside
    one, except below /usr/src and /usr/local/src); raises ValueError saying which rule it breaks."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise ValueError(f"workdir must be an absolute path, got {path!r}")
    if path.strip("/") == "":
        raise ValueError("workdir must not be / (the agent would own what the verifier runs)")
    if not WORKDIR_CHARS.match(path):
        raise ValueError(f"workdir {path!r} has characters other than letters, digits and ._/+-")
    if posixpath.normpath(path) != path or path == "/":
        raise ValueError(f"workdir {path!r} must be a normalised path below / (no '.', '..', '//' or trailing /)")
    for d in SYSTEM_DIRS:
        if (path == d or path.startswith(d + "/")) and not path.startswith(("/usr/src/", "/usr/local/src/")):
            raise ValueError(f"workdir {path!r} is (inside) the system directory {d}")
    return path


class EnvSpec(Record):
    """One environment, ready for rollouts once `image` is set.

    Image: without `dockerfile`, the local base image plus `files` in `workdir` (owned by the
    agent) plus `setup` commands run there as the agent at build time (e.g. create a git history or
    a sqlite file; they may delete their own inputs). With `dockerfile` (imported tasks), that
    Dockerfile on the `context` files, its `FROM` images mapped through the alias table, then
    `workdir` handed to the agent user.

    Verification (`verifier`): `functions` runs the Python `test_*` functions of `tests` with the
    trajforge runner (per-test results); `script` copies `tests` to `/tests` and runs
    `test_command` as root: the reward comes from `/logs/verifier/reward.json|txt` (Harbor), else
    from pytest's `PASSED`/`FAILED` lines, else from the exit code.

    Invariants: tests and solution never enter the image; tests are copied in only after the
    agent's processes are gone; `content_hash` covers everything that decides image and verdict.
    """

    env_id: str
    family: str
    level: int
    seed: int
    source: str = "procedural"
    instruction: str
    files: list[FileSpec] = Field(default_factory=list)
    setup: list[str] = Field(default_factory=list, description="build-time commands, run as the agent in workdir")
    dockerfile: str | None = None
    context: list[FileSpec] = Field(default_factory=list, description="build context of `dockerfile`")
    workdir: str = DEFAULT_WORKDIR
    tests: list[FileSpec]
    verifier: Literal["functions", "script"] = "functions"
    test_command: str | None = None
    solution: list[str] = Field(description="shell commands of the reference solution, run in order")
    protected: list[str] = Field(default_factory=list,
                                 description="globs (relative to workdir) the agent must not change: checksummed "
                                             "before and after each episode")
    knobs_json: str = "{}"
    agent_timeout_s: float | None = None
    test_timeout_s: float | None = None
    agent_user: Literal["agent", "root"] = Field("agent", description=(
        "who runs the agent's commands: the unprivileged `agent` (procedural and LLM-written environments) or "
        "`root` with root's file powers (imported tasks, which assume it, as their own harness runs them); "
        "no network and no-new-privileges either way"))
    expected_changes: list[str] = Field(default_factory=list, description=(
        "paths the reference solution changed in the container (set by the validator): a change an agent "
        "makes that is not here is `unexpected`"))
    image: str | None = None

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, v: str) -> str:
        return check_workdir(v)

    def content_hash(self) -> str:
        payload = self.model_dump(exclude={"image", "env_id", "expected_changes"})
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()
