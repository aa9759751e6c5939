"""The run store on the local disk and on S3 (moto's threaded server, as s3fs's own suite does)."""

import os

from trajforge.schemas.common import Reject
from trajforge.tasks.engine.store import RunStore


def _exercise(store: RunStore):
    d = store.stage_dir("b1", "verify", "fp1")
    n = store.write_records(f"{d}/part-00000.parquet", Reject, [Reject(key="a", reason="r"), Reject(key="b", reason="s")])
    assert n == 2
    store.write_json(f"{store.build_dir('b1')}/build.json", {"status": "committed"})
    assert store.read_records([f"{d}/part-00000.parquet"], Reject)[1].key == "b"
    assert store.find_committed("verify", "fp1") is None  # no manifest yet: not committed
    store.write_json(f"{d}/manifest.json", {"ok": True})
    assert store.find_committed("verify", "fp1").endswith("b1/verify/fp1/manifest.json")
    assert store.builds() == ["b1"]
    store.set_latest("b1")
    assert store.latest() == "b1"
    empty = store.read_table([], Reject)
    assert empty.num_rows == 0 and empty.schema.names == ["key", "reason", "detail"]


def test_local_store(tmp_path):
    store = RunStore(str(tmp_path / "runs"), "ds")
    _exercise(store)
    assert os.path.islink(tmp_path / "runs" / "ds" / "latest")


def test_s3_store(s3_url):
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    store = RunStore(s3_url, "ds")
    assert not store.local
    _exercise(store)
    assert store.url(store.root).startswith("s3://trajforge-test/runs/ds")
