"""The stage contract, the engine that plans, runs, gates and commits any stage, and the run store."""

from .contract import (
                       GateFailed,
                       LimiterFactory,
                       Manifest,
                       Retryable,
                       Shard,
                       ShardResult,
                       Stage,
                       StageContext,
                       sum_counters,
                       upstream_parts,
)
from .runner import StagePlan, commit, execute_shard, fingerprint, fingerprint_components, prepare, read_output
from .store import RunStore

__all__ = ["GateFailed", "LimiterFactory", "Manifest", "Retryable", "Shard", "ShardResult", "Stage", "StageContext",
           "sum_counters", "upstream_parts", "StagePlan", "commit", "execute_shard", "fingerprint", "fingerprint_components",
           "prepare", "read_output", "RunStore"]
