"""Importing a task corpus outside a build (`trajforge envs import`, `benchmarks/corpus_import.py`).

- `discover(root, sample, seed)`: the task folders below `root` (a seeded sample of them to try a corpus);
- `parse(folders)`: each folder as an EnvSpec, or an `import_malformed` reject (no Docker, seconds for
  thousands);
- `admit(envs, ...)`: build and validate through a pool, every outcome appended to a `Journal` as it
  comes (one JSON line, flushed): a second run skips every env_id already journalled, so an interrupted
  import resumes where it stopped (env ids and image tags are content addresses: an edited task is new);
- `tally(outcomes)`: yield per source, by outcome (kept with / without oracle, or the reject reason).
"""

from __future__ import annotations

import json
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable

from ...schemas.config import SandboxConfig, SynthesizeConfig
from ...schemas.environment import EnvSpec
from .formats import TaskFormatError, find_tasks, import_task
from .images import BuildOptions


@dataclass
class Outcome:
    """One candidate's fate. `outcome`: `kept` or the reject reason; `cause`: a failed build's cause code."""

    key: str
    source: str
    outcome: str
    oracle: str = "present"
    cause: str | None = None
    seconds: float = 0.0
    built: bool = False
    image: str | None = None
    detail: str = ""
    spec: str | None = None  # the kept environment as JSON
    content: str | None = None  # the candidate's content hash (None in journals written before it existed)

    @property
    def kept(self) -> bool:
        return self.outcome == "kept"


def discover(root: Path, sample: int | None = None, seed: int = 0) -> list[Path]:
    folders = find_tasks(Path(root))
    if sample is not None and sample < len(folders):
        folders = sorted(random.Random(seed).sample(folders, sample))
    return folders


def parse(folders: Iterable[Path]) -> tuple[list[tuple[Path, EnvSpec]], list[Outcome]]:
    envs, bad = [], []
    for folder in folders:
        try:
            envs.append((folder, import_task(folder)))
        except TaskFormatError as err:
            bad.append(Outcome(key=str(folder), source="?", outcome="import_malformed", detail=str(err)[:1500]))
    return envs, bad


class Journal:
    """Append-only JSONL of outcomes by env_id (a torn last line from a crash is ignored)."""

    def __init__(self, path: Path | None):
        self.path, self.lock = path, threading.Lock()
        self.done: dict[str, Outcome] = {}
        if path and path.exists():
            for line in path.read_text().splitlines():
                try:
                    o = Outcome(**json.loads(line))
                except (ValueError, TypeError):
                    continue
                if o.outcome == "image_build_failed":  # the host may have changed (network, CA): build again
                    self.done.pop(o.key, None)
                else:
                    self.done[o.key] = o

    def holds(self, env: EnvSpec) -> bool:
        """Whether the journal has this environment's outcome: same env id AND same content (another
        content under a journalled id is validated, not skipped; a line without `content`, from before it
        was recorded, is checked again)."""
        o = self.done.get(env.env_id)
        return o is not None and o.content == env.content_hash()

    def add(self, o: Outcome) -> None:
        self.done[o.key] = o
        if self.path:
            with self.lock:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with self.path.open("a") as f:
                    f.write(json.dumps(asdict(o)) + "\n")
                    f.flush()


def admit(envs: list[EnvSpec], s: SynthesizeConfig, sandbox: SandboxConfig, jobs: int, journal: Journal,
          on_result: Callable[[Outcome], None] = lambda o: None, log_dir: Path | None = None,
          client=None) -> list[Outcome]:
    """Build and validate `envs` (the journalled ones are skipped and returned as they were), `jobs` at a
    time; each outcome goes to the journal and to `on_result` as it comes."""
    from ..sandbox import docker_client
    from .validator import validate_configured

    options = BuildOptions.from_config(s.build)
    client = client or docker_client(pool_size=2 * jobs + 4)

    def keep_log(tag: str, text: str) -> None:
        if log_dir is not None:
            log_dir.mkdir(parents=True, exist_ok=True)
            (log_dir / f"{tag.split(':')[-1]}.log").write_text(text)

    def one(env: EnvSpec) -> Outcome:
        content = env.content_hash()  # before validation fills its findings in
        if env.oracle == "absent" and s.require_solution:
            return Outcome(env.env_id, env.source, "no_reference_solution", env.oracle, content=content)
        t0 = time.monotonic()
        v = validate_configured(client, env, s, sandbox, build=options, log_sink=keep_log)
        return Outcome(env.env_id, env.source, "kept" if v.ok else v.reject.reason, env.oracle, v.build_cause,
                       round(time.monotonic() - t0, 3), v.built, env.image, "" if v.ok else v.reject.detail,
                       env.model_dump_json() if v.ok else None, content)

    out = [journal.done[e.env_id] for e in envs if journal.holds(e)]
    todo = [e for e in envs if not journal.holds(e)]
    with ThreadPoolExecutor(jobs) as pool:
        futures = {pool.submit(one, e): e for e in todo}
        for fut in as_completed(futures):
            try:
                o = fut.result()
            except Exception as err:  # Docker failed while checking: infrastructure, not journalled (retried)
                e = futures[fut]
                o = Outcome(e.env_id, e.source, "validation_infra", e.oracle, detail=str(err)[:1500])
            if o.outcome != "validation_infra":
                journal.add(o)
            out.append(o)
            on_result(o)
    return out


def tally(outcomes: Iterable[Outcome]) -> dict[str, dict[str, int]]:
    """{source: {outcome: n}}; kept ones as `kept (oracle)` / `kept (no oracle)`."""
    out: dict[str, dict[str, int]] = {}
    for o in outcomes:
        key = ("kept (oracle)" if o.oracle == "present" else "kept (no oracle)") if o.kept else o.outcome
        d = out.setdefault(o.source, {})
        d[key] = d.get(key, 0) + 1
    return out
