"""The build's own local Dask cluster started early (flows/runtime.py `EarlyCluster`), on its failure paths: a
cluster whose workers cannot start is an error naming the cause at `address()`, within seconds, never a hang;
a warm-up preload that raises leaves a cluster that still runs work. Real LocalClusters of worker processes
(no Docker, no Prefect)."""

from __future__ import annotations

import pytest

from trajforge.flows import runtime


@pytest.fixture
def preload(tmp_path, monkeypatch):
    """Point the early cluster's preload at a module planted in `tmp_path` (spawned workers get the parent's
    sys.path)."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))

    def plant(name: str, body: str | None) -> None:
        if body is not None:
            (tmp_path / f"{name}.py").write_text(body)
        monkeypatch.setattr(runtime, "PRELOAD", name)
    return plant


def test_workers_that_cannot_import_their_preload_are_an_error_naming_it(preload):
    preload("tf_missing_preload_module", None)
    early = runtime.EarlyCluster(1, 1, True)
    try:
        with pytest.raises(RuntimeError, match="local Dask cluster did not start") as err:
            early.address()
        assert "No module named 'tf_missing_preload_module'" in str(err.value)
    finally:
        early.close()


def test_a_preload_that_raises_leaves_a_cluster_that_runs_work(preload):
    preload("tf_raising_preload", "def dask_setup(worker):\n    raise ImportError('planted: no plugin x')\n")
    early = runtime.EarlyCluster(1, 1, True)
    try:
        from distributed import Client

        with Client(early.address()) as client:
            assert client.submit(sum, [1, 2, 3]).result(timeout=60) == 6
    finally:
        early.close()
    early.close()  # idempotent
