"""A Dask worker preload (`dask worker --preload trajforge.flows.dask_preload ...`): what a worker does as
it joins, before any task: reap the sandboxes its engine still holds of processes that are gone (a host
whose worker and engine died mid-build, now back). The engine is the worker's own
($TRAJFORGE_DOCKER_HOST, else the local one). A worker whose engine does not answer still joins (its
stages then fail by name, as without the preload)."""

from __future__ import annotations

import logging

log = logging.getLogger("trajforge.worker")


def dask_setup(worker) -> None:
    from ..tasks.sandbox import reap_here

    try:
        n = reap_here()
    except Exception as err:  # the worker still joins: its stages say what is wrong with the engine
        log.warning("trajforge: could not reap leftover sandboxes on this worker's engine: %s: %s",
                    err.__class__.__name__, err)
        return
    log.warning("trajforge: reaped %d sandbox(es) of dead owners on this worker's engine", n)
