"""The tools layer (tasks/envs/tools/layer.py): the base image + the pinned MCP SDK, which tool
environment images build on."""

from __future__ import annotations

import re

import pytest
from test_tool_harness import ledger_env


@pytest.fixture(scope="module")
def ledger(docker_client):
    from trajforge.tasks.envs.images import ensure_image

    env = ledger_env()
    env.image, _ = ensure_image(docker_client, "trajforge/base:latest", env)
    return env


def test_the_tools_layer_is_pinned_and_content_addressed():
    """Every wheel of the SDK's closure is pinned by version and sha256; the layer's tag follows the base
    and the lock (so environment images follow them too: `image_tag` hashes the layer's id)."""
    from trajforge.tasks.envs.tools import layer

    lock = layer.lock_text()
    pins = [line for line in lock.splitlines() if line and not line.startswith("#")]
    assert pins and all(re.fullmatch(r"[a-z0-9-]+==\S+ --hash=sha256:[0-9a-f]{64}", p) for p in pins), pins
    assert {p.split("==")[0] for p in pins} >= {"mcp", "mcp-types", "pydantic", "pydantic-core", "anyio", "pip"}
    tag = layer.layer_tag("sha256:base1", lock)
    assert tag == layer.layer_tag("sha256:base1", lock) != layer.layer_tag("sha256:base2", lock)
    assert tag != layer.layer_tag("sha256:base1", lock.replace("mcp==2.3.0", "mcp==2.3.1"))
    assert "--no-index" in layer.recipe("sha256:base1", lock) and "--require-hashes" in layer.recipe("sha256:base1", lock)


@pytest.mark.docker
def test_tool_images_build_on_the_tools_layer(docker_client, ledger):
    """The SDK is in the image, root-owned and read-only to the agent; the server imports it from there."""
    from trajforge.tasks.envs.tools import layer

    image = docker_client.images.get(ledger.image)
    layer_id = layer.ensure_tools_layer(docker_client, docker_client.images.get("trajforge/base:latest").id)
    assert layer_id in {image.id, *[h["Id"] for h in image.history() if h.get("Id", "<missing>") != "<missing>"]}
    out = docker_client.containers.run(ledger.image, ["sh", "-c", f"touch {layer.SDK_DIR}/mcp/x; echo $?; python3 -I -c "
                                       f"\"import sys; sys.path.insert(0, '{layer.SDK_DIR}'); import mcp; print(mcp.__file__)\""],
                                       user="1000:1000", network_mode="none", remove=True).decode()
    assert out.splitlines()[-1] == f"{layer.SDK_DIR}/mcp/__init__.py" and out.splitlines()[-2] != "0"
