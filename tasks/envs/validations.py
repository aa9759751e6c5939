"""Kept validations by content, across builds and run folders: `$TRAJFORGE_CACHE/validations/`.

Validating an environment (tasks/envs/validator.py) runs its reference solution and its tests several times, seconds
per environment, and its outcome is a function of what goes in: the environment's content and id, the image it was
built into (by image id: a rebuilt base image is another input), the synthesize stage's code (its code version: a
change to any module of the validator's closure is another input) and the admission and sandbox settings the stage
is fingerprinted by. So a validation that kept an environment is recorded under the digest of exactly those, with
what it found (the `VALIDATED` fields), and a later build that asks the same question reads the answer instead of
running it again. Only kept validations are recorded: a reject (and `validation_infra` above all) is always tried
again. The cache is the host's own (never a file an agent's container can reach); an entry that does not read is a
miss, never an error; an empty cache is only slower (`synthesize.reuse_validations: false` never reads it)."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from ...schemas.environment import VALIDATED, EnvSpec
from ..engine.cache import cache_root

FORMAT = 1


def folder() -> Path:
    return cache_root() / "validations"


def key(env: EnvSpec, image_id: str, code_version: str, settings: dict[str, Any]) -> str:
    """The digest of everything a validation's outcome depends on (module docstring)."""
    payload = {"format": FORMAT, "env_id": env.env_id, "content": env.content_hash(), "image": image_id,
               "code": code_version, "settings": settings}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def recall(digest: str, env: EnvSpec) -> EnvSpec | None:
    """`env` with the fields its recorded validation found, or None (no entry, or one that does not read)."""
    path = folder() / digest[:2] / f"{digest}.json"
    try:
        found = json.loads(path.read_text())
        return EnvSpec.model_validate({**env.model_dump(mode="json"), **{k: found[k] for k in VALIDATED}})
    except (OSError, ValueError, KeyError, TypeError):
        return None


def record(digest: str, env: EnvSpec) -> None:
    """Record what the validation that kept `env` found (written whole or not at all; a failure to write is
    only a later miss)."""
    dump = env.model_dump(mode="json")
    path = folder() / digest[:2] / f"{digest}.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "w") as f:
            json.dump({k: dump[k] for k in VALIDATED}, f)
        os.replace(tmp, path)
    except OSError:
        pass
