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
    from ..tasks.envs.validator import validate_configured
    from ..tasks.sandbox import docker_client

    try:
        client = docker_client(pool_size=2 * jobs + 4, sandbox=sandbox)
    except Exception as err:
        fail(str(err), 1)

    def one(env: EnvSpec):
        return env, validate_configured(client, env, s, sandbox)

    with ThreadPoolExecutor(jobs) as pool:
        return list(pool.map(one, envs))


