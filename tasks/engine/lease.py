"""One live driver per build: a lease file in the run store (any fsspec URL; no flock, so S3 works).

`<runs>/<dataset>/<build_id>/lease.json` holds the owner (`host:pid:process start time`), a random
token, when it was acquired and the last heartbeat. Operational: no stage fingerprints this module.

Invariants:
- acquire = create-if-absent (a hard link locally, a conditional PUT on object stores), then, after
  a short settle, read back and compare the token: only the process whose token is in the file holds
  the lease; anyone else raises LeaseHeld naming the holder and since when.
- a lease is stale when its owner process is gone (same host) or its heartbeat is older than
  `stale_after` refresh intervals (wall clocks of different hosts: keep them NTP-synchronised); a
  stale lease is removed (only if unchanged since read) and taken over, with a message.
- the holder's heartbeat thread rewrites the heartbeat every `refresh_s`; if it finds another token
  (or none), the lease is lost and `check()` raises LeaseLost.
- released (removed, only if still ours) on exit, normal or not; a SIGKILLed holder leaves a lease
  whose process is gone, taken over at the next start.
- `hold()` is re-entrant within a process: the CLI takes the lease before it reaps, the flow takes
  it again (a flow started by a deployment takes it itself).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import threading
import time
import uuid
from typing import Callable, Iterator

from pydantic import BaseModel, ValidationError

from .identity import owner_alive, owner_label
from .store import RunStore

REFRESH_S = 15.0
STALE_AFTER = 4  # refresh intervals without a heartbeat
SETTLE_S = 0.2  # between create and the read-back that decides who holds the lease
FILE = "lease.json"
UNREADABLE = "unreadable"  # the token of a lease file that does not parse (stale at once)


class LeaseHeld(RuntimeError):
    """Another live process holds the build."""


class LeaseLost(RuntimeError):
    """This process's lease was taken over (it looked stale to another driver)."""


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


class LeaseInfo(BaseModel):
    owner: str
    token: str
    build_id: str
    config_hash: str = ""
    acquired_at: float
    heartbeat_at: float
    refresh_s: float

    def describe(self, now: float | None = None) -> str:
        if self.token == UNREADABLE:
            return "an unreadable lease file"
        age = (now or time.time()) - self.heartbeat_at
        host, _, ident = self.owner.partition(":")
        return (f"process {ident.partition(':')[0] or '?'} on {host or '?'} since {_iso(self.acquired_at)} "
                f"(last heartbeat {age:.0f} s ago)")

    def stale_reason(self, stale_after: int, now: float | None = None) -> str | None:
        """Why this lease may be taken over, or None while its holder looks alive."""
        if self.token == UNREADABLE:
            return "it cannot be read"
        if self.owner == owner_label():
            return "it was left by this very process"
        alive = owner_alive(self.owner)  # None: another host's process, known only by its heartbeat
        if alive is False:
            return "its process is gone"
        if alive:  # a live holder on this host is never taken over (a full disk may have stopped its beats)
            return None
        age = (now or time.time()) - self.heartbeat_at
        if age > stale_after * self.refresh_s:
            return f"no heartbeat for {age:.0f} s (> {stale_after} x {self.refresh_s:g} s)"
        return None


class Lease:
    """The lease of one build. Use `hold()`; `acquire`/`release` are its parts."""

    def __init__(self, store: RunStore, build_id: str, config_hash: str = "", refresh_s: float = REFRESH_S,
                 stale_after: int = STALE_AFTER, say: Callable[[str], None] = print):
        self.store, self.build_id, self.config_hash = store, build_id, config_hash
        self.path = f"{store.build_dir(build_id)}/{FILE}"
        self.refresh_s, self.stale_after, self.say = refresh_s, stale_after, say
        self.info: LeaseInfo | None = None
        self.lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def read(self) -> LeaseInfo | None:
        """The lease in the store; None if there is none. An unreadable one counts as stale."""
        try:
            return LeaseInfo.model_validate_json(self.store.read_text(self.path))
        except FileNotFoundError:
            return None
        except (ValidationError, ValueError):
            return LeaseInfo(owner="?", token=UNREADABLE, build_id=self.build_id, acquired_at=0, heartbeat_at=0,
                             refresh_s=self.refresh_s)

    def acquire(self) -> LeaseInfo:
        for _ in range(5):
            now = time.time()
            mine = LeaseInfo(owner=owner_label(), token=uuid.uuid4().hex, build_id=self.build_id,
                             config_hash=self.config_hash, acquired_at=now, heartbeat_at=now,
                             refresh_s=self.refresh_s)
            if self.store.create_exclusive(self.path, mine.model_dump_json()):
                time.sleep(SETTLE_S)
                cur = self.read()
                if cur is not None and cur.token == mine.token:
                    self.info = mine
                    self._thread = threading.Thread(target=self._beat, name=f"lease-{self.build_id}", daemon=True)
                    self._thread.start()
                    return mine
                if cur is None:
                    continue
                raise LeaseHeld(self.held_message(cur))
            cur = self.read()
            if cur is None:  # released meanwhile: try again
                continue
            reason = cur.stale_reason(self.stale_after)
            if reason is None:
                raise LeaseHeld(self.held_message(cur))
            self.say(f"taking over build {self.build_id} from {cur.describe()}: {reason}")
            self._remove_if(cur.token)
        raise LeaseHeld(f"build {self.build_id}: could not take its lease ({self.store.url(self.path)}): "
                        "other processes keep taking it")

    def held_message(self, cur: LeaseInfo) -> str:
        return (f"build {self.build_id} is already running: held by {cur.describe()}; "
                "nothing was started (wait for it, or stop that process)")

    def _remove_if(self, token: str) -> bool:
        cur = self.read()
        if cur is not None and cur.token == token:
            self.store.remove(self.path)
            return True
        return False

    def _beat(self) -> None:
        while not self._stop.wait(self.refresh_s):
            try:
                cur = self.read()
                if cur is None or cur.token != self.info.token:
                    self.lost = (f"the lease of build {self.build_id} was taken over by "
                                 f"{cur.describe() if cur else 'another process (removed)'}")
                    return
                self.info = self.info.model_copy(update={"heartbeat_at": time.time()})
                self.store.write_text(self.path, self.info.model_dump_json())
            except Exception:  # a full disk, a network blip: try again next time (stale only after several)
                continue

    def check(self) -> None:
        """Raise LeaseLost if another driver took this build over."""
        if self.lost:
            raise LeaseLost(f"{self.lost}; this process stops here (its finished shards are kept)")

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.refresh_s + 5)
        if self.info is not None and not self.lost:
            with contextlib.suppress(Exception):  # never mask the error a build ends with
                self._remove_if(self.info.token)
        self.info = None


_HELD: dict[str, tuple[Lease, int]] = {}
_LOCK = threading.Lock()


@contextlib.contextmanager
def hold(store: RunStore, build_id: str, config_hash: str = "", say: Callable[[str], None] = print,
         **kw) -> Iterator[Lease]:
    """Hold the lease of `build_id` for the block (re-entrant within a process); raises LeaseHeld."""
    key = store.url(f"{store.build_dir(build_id)}/{FILE}")
    with _LOCK:
        held = _HELD.get(key)
        if held is not None:
            _HELD[key] = (held[0], held[1] + 1)
    if held is None:
        lease = Lease(store, build_id, config_hash, say=say, **kw)
        lease.acquire()
        with _LOCK:
            _HELD[key] = (lease, 1)
    else:
        lease = held[0]
    try:
        yield lease
    finally:
        with _LOCK:
            lease, n = _HELD[key]
            if n > 1:
                _HELD[key] = (lease, n - 1)
            else:
                del _HELD[key]
        if n == 1:
            lease.release()


def live_leases(store: RunStore, stale_after: int = STALE_AFTER) -> list[LeaseInfo]:
    """The leases of this dataset's builds whose holders look alive."""
    out = []
    for p in store.fs.glob(f"{store.root}/*/{FILE}"):
        try:
            info = LeaseInfo.model_validate_json(store.read_text(p))
        except (FileNotFoundError, ValidationError, ValueError):
            continue
        if info.stale_reason(stale_after) is None or info.owner == owner_label():
            out.append(info)
    return out


# -- fencing: a shard commits only under the lease it was started with ------------------------------
RUNTIME_KEY = "lease_token"  # in `StageContext.runtime`: the token of the lease the shard runs under
ABANDONED = "_abandoned"  # in a stage folder: `<shard>.json` = {"token", "reason"} written by the driver


class ShardFenced(RuntimeError):
    """A shard may not commit: the lease it ran under is gone or another's, or its driver abandoned it."""


def abandoned_path(plan_dir: str, shard: str) -> str:
    return f"{plan_dir.rstrip('/')}/{ABANDONED}/{shard}.json"


def abandon(store: RunStore, plan_dir: str, shard: str, token: str, reason: str) -> None:
    """The driver gives up on `shard` (e.g. past `dask.shard_timeout_s`): whatever still runs it under
    `token` is refused its part and marker (`fence`); a later run under another token is not."""
    store.write_json(abandoned_path(plan_dir, shard), {"token": token, "reason": reason, "at": time.time()})


def fence(store: RunStore, build_id: str, token: str, plan_dir: str, shard: str) -> None:
    """Raise ShardFenced unless `token` still holds the build's lease and the shard was not abandoned
    under it. Called right before each write a shard commits (its part, its rejects, its marker), so
    a late shard of an abandoned or taken-over run never overwrites what a newer run wrote. (Files
    only, no compare-and-swap: the window left is between this read and the rename that follows.)"""
    cur = Lease(store, build_id, say=lambda _: None).read()
    if cur is None or cur.token != token:
        raise ShardFenced(f"shard {shard} of {plan_dir}: the lease it ran under is "
                          f"{'released' if cur is None else 'now held by ' + cur.describe()}; its output is "
                          "discarded (the build's current run redoes the shard)")
    path = abandoned_path(plan_dir, shard)
    if store.exists(path):
        with contextlib.suppress(FileNotFoundError, ValueError):
            rec = store.read_json(path)
            if rec.get("token") == token:
                raise ShardFenced(f"shard {shard} of {plan_dir} was abandoned by its driver ({rec.get('reason', '?')}); "
                                  "its output is discarded (it is redone on resume)")
