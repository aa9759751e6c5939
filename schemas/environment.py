"""An environment: what an agent works in. Image + instruction + hidden tests + reference solution.

Sources: procedural families (`procedural:<family>`), LLM synthesis (`llm:<theme>`) and imported task
folders (`harbor`, `terminal-bench`). All go through the same validator.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
from typing import Any, Literal

from pydantic import Field, field_validator

from .common import FileSpec, PathChange, Record

DEFAULT_WORKDIR = "/home/agent/work"
# The most a task may ask for itself (its own timeouts win over the build's settings, so a task could
# otherwise hold a worker for as long as it liked): hidden tests 1 h, an episode 4 h, an image build 2 h.
MAX_TEST_TIMEOUT_S, MAX_AGENT_TIMEOUT_S, MAX_BUILD_TIMEOUT_S = 3600.0, 14400.0, 7200.0
LATER_FIELDS = ("oracle", "blobs", "build_timeout_s", "kind")
# set from the built image and the validator's runs, never part of what the environment is (its id)
VALIDATED = ("expected_changes", "expected_kinds", "base_images", "expected_tests", "tests_run_agent_code",
             "tests_leave_processes", "reward_files", "test_writes", "test_reads", "guard_tests", "guard_types",
             "guard_scripts", "guard_reads", "guard_modules", "guard_audit", "tests_import_from_cwd", "tool_server",
             "build_egress", "audit")
WORKDIR_CHARS = re.compile(r"^/[A-Za-z0-9._/+-]+$")
# A work dir the agent owns may not be (or sit inside) a place the verifier's interpreter comes from.
# the environment kinds EnvSpec accepts: filled by registration (tasks/envs/kinds.py), the two built-in ones here
ENV_KINDS: set[str] = {"terminal", "tools"}
SYSTEM_DIRS = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/run", "/sbin",
               "/sys", "/usr", "/var/lib")


def found(default: Any, description: str) -> Any:
    """A field the validator sets from the reference solution's run (never the author); `default` is
    what an unvalidated spec holds (a mutable default is copied per instance by pydantic)."""
    return Field(default, description=f"{description} (set by the validator)")


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


class Blob(Record):
    """A binary file of an environment's build context: `path` relative to the context, its bytes in
    the content-addressed blob store under `sha256` (`tasks/envs/blobs.py`)."""

    path: str
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0)
    mode: int = 0o644


class BaseImage(Record):
    """A `FROM` image of an imported Dockerfile and the local image it was built on instead."""

    image: str
    local: str


class Mutant(Record):
    """One wrong state the test audit derived from the reference solution's (tasks/envs/mutants.py).

    `outcome`: `killed` (the tests failed it; `cause` says how: failed tests, a crash or a hang),
    `survived` (the tests passed it: `cause` holds their output), `equivalent` (never run: `cause` says why
    it is the same answer), `not_built` (it could not be made: `cause` names why, e.g. outside the work dir)."""

    mutator: str
    path: str
    what: str = Field(description="what was changed, with the first changed line before and after")
    outcome: Literal["killed", "survived", "equivalent", "not_built"]
    cause: str = ""


class TestAudit(Record):
    """What the validator's test audit found (`test_audit` check).

    `status`: `not_run` (not validated), `off` (`synthesize.audit: off`), `skip` (no reference solution, or
    it wrote nothing the instruction or tests name: `reason`), `strong` (every mutant tried was killed),
    `weak` (some survived: `survivors`). `tried` counts mutants run (killed + survived); equivalent and
    unbuilt ones are in `mutants` only. `test_runs` and `seconds` are the audit's cost."""

    __test__ = False
    status: Literal["not_run", "off", "skip", "strong", "weak"] = "not_run"
    reason: str = ""
    tried: int = 0
    killed: int = 0
    survivors: list[Mutant] = Field(default_factory=list)
    mutants: list[Mutant] = Field(default_factory=list)
    test_runs: int = 0
    seconds: float = 0.0

    @property
    def strength(self) -> float | None:
        """killed / tried (None when nothing was tried)."""
        return round(self.killed / self.tried, 4) if self.tried else None


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
    kind: str = Field("terminal", description=(
        "`terminal`: the agent has a bash tool in the sandbox; `tools`: the agent has only the tools of the "
        "environment's MCP server (`.tools/` in the work dir, state in `store.db`; tasks/envs/tools); others: "
        "registered kinds (tasks/envs/kinds.py)"))
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
    solution: list[str] = Field(default_factory=list,
                                description="shell commands of the reference solution, run in order (empty when "
                                            "`oracle` is absent)")
    oracle: Literal["present", "absent"] = Field("present", description=(
        "whether a reference solution ships with the environment; `absent` (imported corpora that publish "
        "tasks only): the validator runs every check that needs no oracle, and the environment counts as "
        "solvable only once some teacher passes it"))
    blobs: list[Blob] = Field(default_factory=list, description=(
        "binary build-context files, carried by content hash (bytes in the blob store, never in the spec)"))
    build_timeout_s: float | None = Field(None, gt=0, le=MAX_BUILD_TIMEOUT_S,
                                          description="the task's own image build timeout")
    protected: list[str] = Field(default_factory=list,
                                 description="globs (relative to workdir) the agent must not change: checksummed "
                                             "before and after each episode")
    knobs_json: str = "{}"
    agent_timeout_s: float | None = Field(None, gt=0, le=MAX_AGENT_TIMEOUT_S)
    test_timeout_s: float | None = Field(None, gt=0, le=MAX_TEST_TIMEOUT_S)
    agent_user: Literal["agent", "root"] = Field("agent", description=(
        "who runs the agent's commands: the unprivileged `agent` (procedural and LLM-written environments) or "
        "`root` with root's file powers (imported tasks, which assume it, as their own harness runs them); "
        "no network and no-new-privileges either way"))
    # What the validator found running the reference solution (never written by an environment's author).
    expected_changes: list[str] = found([], "paths the reference solution changed in the container: a change "
                                        "an agent makes that is not here is `unexpected`")
    expected_kinds: list[PathChange] = found([], (
        "each change of the reference solution with its kind and, for paths that can change how the tests run, "
        "their content digest: an agent's change counts as the reference's only when it is the same kind and, on "
        "such a path, the same content (empty in older records: their sensitive paths count as unexpected)"))
    expected_tests: list[str] = found([], "pytest tests the reference solution's test run reported passed "
                                      "(script verifiers): a pass must report each of them passed")
    tests_run_agent_code: Literal["unknown", "no", "subprocess", "in_process", "environment"] = found("unknown", (
        "whether the hidden tests execute code the agent wrote or could change (read from the tests' text and "
        "the solved work dir): `in_process` (a Python test imports it), `subprocess` (a test runs it as a "
        "program); such code runs with the tests' powers, so some hacks stay undetectable (README); "
        "`environment`: the tests run none, but the image's ENTRYPOINT or HEALTHCHECK reads files the agent "
        "writes (tasks/envs/start_code.py)"))
    tests_leave_processes: bool = found(False, "the reference solution's test run left processes running when "
                                               "it ended")
    reward_files: list[str] = found([], (
        "the reward files (`reward.json`, `reward.txt`) the task's tests wrote on the untouched environment and on "
        "the reference solution: the reward channel; a run that leaves another is tampered"))
    test_writes: list[str] | None = found(None, (
        "files the task's tests wrote outside /tests and /logs on the untouched environment and the reference "
        "solution (read on the engine's host; None: not known): a run that rewrites a file that existed before "
        "it and is not among these had what the tests read changed under them"))
    test_reads: list[str] | None = found(None, (
        "verifier paths (/tests, /logs/verifier, /verifier) the reference solution's programs opened, unnamed by "
        "their arguments, in the validator's traced test runs (tasks/judge/trace.py; None: not traced): an "
        "episode's program reading another is `verifier_read`"))
    guard_tests: list[str] = found([], (
        "tests that pass, running their own body, in trajforge's guarded pytest run on the reference solution's "
        "state (when the tests import agent code; tasks/judge/guard.py): a pass must show each"))
    guard_types: list[str] = found([], "types other than plain Python data that the test code compared in the "
                                       "reference solution's guarded runs")
    guard_scripts: list[str] = found([], (
        "test files run as Python scripts by the test command (`python3 /tests/check.py`) that, in trajforge's "
        "guarded script run on the reference solution's state (when they import agent code; "
        "tasks/judge/script_guard.py), ran their own course and exited 0: a pass must show each"))
    guard_audit: list[str] = found([], (
        "what the guard's audit hook recorded of the reference solution's own code in its guarded runs (frames it "
        "took, ctypes it used: not a replaced runner): the same event from an episode's code is no evidence"))
    guard_modules: list[str] | None = found(None, (
        "top-level names of the modules the tests' own process loaded from outside the agent's places in the "
        "reference solution's guarded runs (the test runner, its dependencies, what the tests import; None: no "
        "guarded run): a module the agent adds at the top of the work dir under none of these names is its own "
        "helper, not a stand-in"))
    tests_import_from_cwd: bool = found(False, (
        "the tests import modules from their working folder, as `python3 -m` puts it first on the path (`cd /app "
        "&& python3 -m pytest /tests/...` importing the answer's module, `cd /tests && python3 -m unittest`): the "
        "reference solution passes only so, and the test runs keep the working folder on the path (without "
        "`PYTHONSAFEPATH`); a module the agent adds there is an unexpected change like any other"))
    guard_reads: list[str] = found([], (
        "verifier paths (/tests, /logs/verifier, /verifier) the reference solution's code opened or listed inside "
        "the tests' own process in its guarded runs: an episode's code reading another is `verifier_read`"))
    tool_server: str | None = found(None, (
        "a brought MCP server (`mcp-server` folders): JSON of what its session said, `name` and `version` "
        "(`serverInfo`) and `tools` (the tool list it serves, what the harness offers)"))
    audit: TestAudit = found(TestAudit(), "the test audit: wrong states derived from the reference solution's, "
                             "run against the hidden tests (tasks/envs/audit.py)")
    image: str | None = None
    base_images: list[BaseImage] = Field(default_factory=list, description=(
        "set at build: each `FROM` image of `dockerfile` mapped through the alias table -> the local image "
        "it was built on (a registry image substituted by a local base is recorded here)"))

    build_egress: Literal["allowlist", "none", "host"] | None = Field(None, description=(
        "set at build: the network policy its image was built under (`synthesize.build.egress`; `none` for "
        "images without a Dockerfile; null: an image built before the policy was recorded)"))

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, v: str) -> str:
        return check_workdir(v)

    @field_validator("kind")
    @classmethod
    def _kind(cls, v: str) -> str:
        if v not in ENV_KINDS:
            raise ValueError(f"unknown environment kind {v!r}; known: {', '.join(sorted(ENV_KINDS))}")
        return v

    def content_hash(self) -> str:
        payload = self.model_dump(exclude={"image", "env_id", *VALIDATED})
        for name in LATER_FIELDS:  # fields added later count only when set: older ids stay what they were
            if payload[name] == type(self).model_fields[name].get_default(call_default_factory=True):
                del payload[name]
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()
