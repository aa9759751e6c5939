"""Synthesize's plan without Docker: a near-duplicate travels with the first of its group, into that one's
shard, so the stage can check it in its place when the first is rejected (tasks/synthesize.py)."""

from __future__ import annotations

from types import SimpleNamespace

from helpers import small_config

from trajforge.schemas.config import parse_config
from trajforge.schemas.environment import EnvSpec
from trajforge.tasks.engine.contract import Manifest
from trajforge.tasks.engine.store import RunStore
from trajforge.tasks.envs.families import get_family
from trajforge.tasks.synthesize import SynthesizeStage


def test_near_duplicates_go_to_the_shard_of_the_first_of_their_group(tmp_path):
    envs = [get_family(name).generate(1, 0) for name in ("log_report", "file_search", "csv_convert")]
    copies = [e.model_copy(update={"env_id": e.env_id + "-copy", "source": "harbor"}) for e in envs[1:]]
    store = RunStore(str(tmp_path / "runs"), "plan")
    part = str(tmp_path / "p0.parquet")
    store.write_records(part, EnvSpec, [*copies, *envs])
    config = parse_config(small_config(tmp_path / "runs", **{"synthesize.envs_per_shard": 1}))
    shards = SynthesizeStage().plan(SimpleNamespace(store=store, config=config),
                                    {"propose": Manifest.model_construct(parts=[part])})
    # procedural first: the copies (an imported source) are the near duplicates, each in its original's shard
    assert [s.payload["env_ids"] for s in shards] == [[e.env_id] for e in sorted(envs, key=lambda e: e.env_id)]
    for shard in shards:
        (first,) = shard.payload["env_ids"]
        want = {c.env_id: first for c in copies if c.env_id == first + "-copy"}
        assert shard.payload["duplicates"] == want
