"""CI runs the suite as a fresh machine would (`.ci/run`: every cache empty by tests/_fresh.py, the images the tests
build removed, a changing order from one printed seed): a planted test that passes only on a warm cache, or only
after another test, fails that run, and the seed it prints replays the order."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from _fresh import CACHES, fresh_env

ROOT = Path(__file__).resolve().parent.parent
PLANT = '''
import os
from pathlib import Path

STATE = []


def test_reads_what_an_earlier_run_left():  # the cache as trajforge resolves it (tasks/envs/tools/layer.py, cache_root)
    cache = Path(os.environ.get("TRAJFORGE_CACHE", "~/.cache/trajforge")).expanduser()
    assert (cache / "left-by-an-earlier-run").exists()


def test_a_writes():
    STATE.append(1)


def test_b_reads_what_test_a_wrote():
    assert STATE == [1]
'''
B_FIRST = 1  # under this seed pytest-randomly runs test_b before test_a (test_planted.py's node ids)


def run(args: list[str], env: dict[str, str], plant: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args, "-c", str(ROOT / "pyproject.toml"), f"--rootdir={plant}",
                           "-p", "no:cacheprovider", str(plant / "test_planted.py")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_a_test_that_needs_a_warm_cache_or_another_test_fails_the_ci_run(tmp_path):
    plant = tmp_path / "plant"
    plant.mkdir()
    (plant / "test_planted.py").write_text(PLANT)
    warm = tmp_path / "warm"
    warm.mkdir()
    (warm / "left-by-an-earlier-run").write_text("")
    here = {**os.environ, "TRAJFORGE_CACHE": str(warm)}

    # a warm machine in file order: all pass, so the defects are hidden there
    res = run(["-m", "pytest", "-p", "no:randomly", "-q"], here, plant)
    assert res.returncode == 0 and "3 passed" in res.stdout, res.stdout + res.stderr

    # CI's way: fresh caches, both tiers of `make test` (tests/_suite.py), a seed
    fresh = fresh_env(tmp_path / "fresh")
    assert set(fresh) == set(CACHES) and all(not any(Path(p).iterdir()) for p in fresh.values())
    res = run(["tests/_suite.py", "--workers", "2", "-q", "-p", "randomly", f"--randomly-seed={B_FIRST}"],
              {**here, **fresh}, plant)
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    assert "FAILED test_planted.py::test_reads_what_an_earlier_run_left" in out, out
    assert "FAILED test_planted.py::test_b_reads_what_test_a_wrote" in out, out
    assert "1 passed, 2 failed" in out and f"--randomly-seed={B_FIRST}" in out.splitlines()[-2], out


def test_each_run_gets_a_seed_that_is_printed(tmp_path):
    plant = tmp_path / "plant"
    plant.mkdir()
    (plant / "test_planted.py").write_text("def test_one():\n    pass\n")
    res = run(["tests/_suite.py", "--workers", "1", "-q"], dict(os.environ), plant)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    first = next(line for line in out.splitlines() if "test order seed" in line)
    seed = first.split("test order seed ")[1].split()[0]
    assert f"-p randomly --randomly-seed={seed}" in first and f"--randomly-seed={seed}" in out.splitlines()[-2], out
    # and the summary names the slowest tests of every tier, with their seconds (here: the only one)
    lines = out.splitlines()
    at = lines.index("the 1 slowest tests (s, tier, test):")
    assert lines[at + 1].split()[-1] == "test_planted.py::test_one" and float(lines[at + 1].split()[0]) >= 0, out


@pytest.mark.docker
def test_the_images_the_tests_build_are_removed_and_the_base_image_kept(second_engine, registry, monkeypatch):
    """On a second engine of its own (the shared one keeps other runs' images): a tools layer, an environment image,
    a naive-harness image, a test's `trajforge/...` tag and an environment image pulled by digest (listed as
    `REGISTRY/trajforge/env:<none>`) go; the set-up's base image stays."""
    import io

    import _fresh

    sock, client = second_engine
    monkeypatch.setenv("DOCKER_HOST", sock)
    made = {"trajforge/tools:fresh-test": {"trajforge.image": "tools-layer"},
            "trajforge/env:fresh-test": {"trajforge.image": "env"},
            "tf-naive/fresh-test:1": {"tf-naive": "1"}, "trajforge/test-writable:fresh": {}}
    for tag, labels in made.items():
        client.images.build(fileobj=io.BytesIO(f"FROM trajforge/base:latest\nRUN echo {tag} > /tag\n".encode()),
                            tag=tag, labels=labels, rm=True, network_mode="none")
    pushed = f"{registry}/trajforge/env:fresh-pulled"
    client.images.get("trajforge/env:fresh-test").tag(pushed)
    client.images.push(pushed)
    digest = client.images.get_registry_data(pushed).id
    client.images.remove(pushed)
    by_digest = client.images.pull(f"{registry}/trajforge/env@{digest}")
    assert set(made) <= set(_fresh.built_images())
    removed, refused = _fresh.remove_images()
    assert set(made) <= set(removed) and refused == []
    left = {t for img in client.images.list() for t in img.tags}
    assert not left & set(made) and "trajforge/base:latest" in left
    assert by_digest.id not in {img.id for img in client.images.list()}
    assert _fresh.built_images() == []


def test_long_tests_leave_make_test_and_run_by_name_or_in_make_test_long():
    """`long` tests are deselected from a run that does not name their file (`make test`'s tiers), run when it does
    (`pytest path::test` alone), and all run with TRAJFORGE_LONG=1 (`make test-long`, CI after `make test`); the
    real project's likewise (TRAJFORGE_REAL_PROJECT=1, `make test-real`). `make test` with them all in took about
    2 hours on CI's two cores (stop 61), past its 90 minutes (issue 52)."""
    def collected(*args: str, **env: str) -> set[str]:
        out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:randomly", *args],
                             cwd=ROOT, env={**os.environ, "TRAJFORGE_LONG": "", "TRAJFORGE_REAL_PROJECT": "", **env}, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
        return {line for line in out.stdout.splitlines() if "::" in line}

    chaos = "tests/test_chaos.py::test_driver_killed_inside_each_stage_then_resumed_loses_and_duplicates_nothing"
    venue = "tests/test_integrity.py::test_trajforge_verify_flags_every_hack_and_passes_every_solve"
    suite = collected("tests/", "-m", "docker")
    assert chaos not in suite and f"{venue}[fresh]" in suite and f"{venue}[in_place]" not in suite
    assert f"{venue}[isolated]" in collected(f"{venue}[isolated]")  # named: runs alone
    # the real project: the same rule, with TRAJFORGE_REAL_PROJECT=1 (make test-real); one collection for both groups
    real = "tests/test_repos_real.py::"
    assert not any(t.startswith(real) for t in suite)
    every = collected("tests/", "-m", "long or docker", TRAJFORGE_LONG="1", TRAJFORGE_REAL_PROJECT="1")
    assert {chaos, f"{venue}[in_place]", f"{venue}[isolated]", f"{venue}[fresh]"} <= every
    assert any(t.startswith(real) for t in every)
