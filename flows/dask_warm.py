"""The preload of the workers of a build's own local cluster (flows/runtime.py `EarlyCluster`): import what every
shard runs (the pipeline's stage modules and the shard task) as the worker starts, so the first stage does not wait
for a worker process's imports. The cluster starts while the driver waits for its Prefect API server: the imports
overlap that wait instead of following it."""

from __future__ import annotations


def dask_setup(worker) -> None:
    from ..tasks import pipeline  # noqa: F401  (every stage module of the default pipeline)
    from . import build  # noqa: F401  (the shard task, and through it the stage machinery)
