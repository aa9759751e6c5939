"""What `trajforge envs ...` commands share: validator settings from a build config, and the validator run over
several environments (the same validator as a build)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional

from ..schemas.config import ConfigError, SandboxConfig, SynthesizeConfig, load_config
from ..schemas.environment import EnvSpec
from .console import fail


def validator_settings(config: Optional[Path]) -> tuple[SynthesizeConfig, SandboxConfig]:
    """The synthesize and sandbox settings of `config` (a build config), or the defaults without one."""
    if config is None:
        return SynthesizeConfig(families=[{"name": "log_report"}]), SandboxConfig()
    try:
        cfg = load_config(config)
    except ConfigError as err:
        fail(str(err))
    return cfg.synthesize, cfg.sandbox


def validate_all(envs: list[EnvSpec], s: SynthesizeConfig, sandbox: SandboxConfig, jobs: int):
    """(environment, validation) of each of `envs`, `jobs` at a time, with the validator a build runs."""
    from ..tasks.envs.audit import AuditSettings
    from ..tasks.envs.catalogue import sibling_of
    from ..tasks.envs.validator import validate_env
    from ..tasks.sandbox import docker_client

    try:
        client = docker_client(pool_size=2 * jobs + 4, sandbox=sandbox)
    except Exception as err:
        fail(str(err), 1)

    from ..tasks.synthesize import build_options

    def one(env: EnvSpec):
        return env, validate_env(client, env, sandbox, sandbox.base_image, s.image_aliases, s.solution_timeout_s,
                                 s.test_timeout_s, sibling=sibling_of, build=build_options(s),
                                 audit=AuditSettings(s.audit, s.audit_mutants))

    with ThreadPoolExecutor(jobs) as pool:
        return list(pool.map(one, envs))


