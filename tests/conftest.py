"""Shared fixtures: a real Docker engine, the base image, small build configs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def docker_client():
    from trajforge.tasks.sandbox import docker_client as make

    client = make()  # raises DockerUnavailable with instructions: `make test` sets the engine up
    client.images.get("trajforge/base:latest")
    return client


@pytest.fixture(scope="session")
def sandbox_cfg():
    from trajforge.schemas.config import SandboxConfig

    return SandboxConfig()


@pytest.fixture
def make_config(tmp_path):
    from helpers import small_config

    from trajforge.schemas.config import parse_config

    def make(**overrides):
        return parse_config(small_config(tmp_path / "runs", **overrides))
    return make


@pytest.fixture(scope="module")
def prefect_api():
    """One Prefect API server for a test module's builds (as the CLI starts one per process)."""
    from trajforge.flows import runtime

    old = os.environ.pop("PREFECT_API_URL", None)
    runtime.ensure_prefect_api()
    yield
    runtime.stop_prefect_api()
    if old:
        os.environ["PREFECT_API_URL"] = old
