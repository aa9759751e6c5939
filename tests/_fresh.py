"""A fresh machine for one run: every cache the project's code and tests use, empty, and none of the images the
tests build. CI (`.ci/run`) runs the suite this way, so that state left by earlier runs cannot hide a missing
step; tests/test_fresh_machine.py runs a planted test under the same isolation and asserts that it fails.

Invariants: `fresh_env(dir)` names a new, empty folder under `dir` for each cache variable of `CACHES` (nothing
else of the environment changes); `remove_images()` removes every image trajforge or its tests build (labelled
`trajforge.image` or `tf-naive`, or a `trajforge/...` tag) but never the set-up's base image and its rootfs
(`make setup`: `deploy/images/build-base.sh`), nor an image a container still uses (the engine refuses; reported).

Usage (stdlib only: it runs before the virtualenv exists):
  python3 tests/_fresh.py env DIR     # `export VAR=...` lines for a shell's `eval`
  python3 tests/_fresh.py images      # remove the images (the Docker engine of $DOCKER_HOST or the default)
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

CACHES = {
    # the tools layer's wheels, pinned packages' artifacts, the embedded model (`make teacher` converts it into
    # this cache), vLLM's and Inductor's compile caches, import journals
    "TRAJFORGE_CACHE": "trajforge",
    "HF_HOME": "huggingface",          # `datasets`' Arrow cache of loaded Parquet, hub downloads
    "PIP_CACHE_DIR": "pip",            # pip's downloads (the wheelhouse, pinned packages' locks and installs)
    "npm_config_cache": "npm",         # npm's tarballs and metadata (pinned npm packages)
    "PREFECT_HOME": "prefect",         # Prefect's profiles and its local server database
}
KEPT_IMAGES = ("trajforge/base", "trajforge/rootfs")  # built by `make setup`, not by the tests
IMAGE_LABELS = ("trajforge.image", "tf-naive")         # environment and tools layers; tests/naive_harness.py


def fresh_env(root: Path) -> dict[str, str]:
    """Each cache variable of `CACHES` pointing at a new, empty folder under `root`."""
    out = {}
    for var, name in CACHES.items():
        folder = Path(root) / name
        folder.mkdir(parents=True, exist_ok=False)
        out[var] = str(folder)
    return out


def _docker(*args: str) -> list[str]:
    res = subprocess.run(["docker", *args], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args)}: {res.stderr.strip()}")
    return [line for line in res.stdout.splitlines() if line.strip()]


def _ref(repo: str, tag: str, image_id: str) -> str:
    """`repo:tag`, or the image's id when either is `<none>` (untagged, or pulled by digest: `host/repo:<none>`)."""
    return image_id if "<none>" in (repo, tag) else f"{repo}:{tag}"


def _kept(ref: str) -> bool:
    return ref.startswith(tuple(f"{k}:" for k in KEPT_IMAGES))


def built_images() -> list[str]:
    """References (`repo:tag`, or the id of an untagged one) of the images trajforge and its tests build."""
    refs: set[str] = set()
    fmt = "{{.Repository}} {{.Tag}} {{.ID}}"
    for label in IMAGE_LABELS:
        for line in _docker("images", "--filter", f"label={label}", "--format", fmt):
            refs.add(_ref(*line.split()))
    for line in _docker("images", "--format", fmt):
        repo, tag, image_id = line.split()
        if repo.startswith("trajforge/") and not _kept(f"{repo}:{tag}"):
            refs.add(_ref(repo, tag, image_id))
    return sorted(r for r in refs if not _kept(r))


def remove_images() -> tuple[list[str], list[str]]:
    """Remove `built_images()`; (removed, refused with the engine's reason). An image already gone with another of
    its references counts as removed."""
    removed, refused = [], []
    for ref in built_images():
        res = subprocess.run(["docker", "rmi", "--force", ref], capture_output=True, text=True)
        if res.returncode == 0 or "No such image" in res.stderr:
            removed.append(ref)
        else:
            refused.append(f"{ref}: {res.stderr.strip()}")
    return removed, refused


def main(argv: list[str]) -> int:
    if argv[:1] == ["env"] and len(argv) == 2:
        print("\n".join(f"export {k}={shlex.quote(v)}" for k, v in fresh_env(Path(argv[1])).items()))
        return 0
    if argv == ["images"]:
        removed, refused = remove_images()
        print(f"fresh machine: removed {len(removed)} image(s) the tests build (kept {', '.join(KEPT_IMAGES)})")
        for line in refused:
            print(f"  not removed: {line}")
        return 0
    print(__doc__.split("Usage")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
