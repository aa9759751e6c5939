"""The change walk: what an episode changed in its container, against its image's own file list.

A change is found by its ctime, which creating, writing, renaming, chmod-ing or touching a file sets to
the current time and which no process without CAP_SYS_TIME can set back; a deletion changes its
folder's ctime, and that folder's entries are compared with the image's list. For an unprivileged
agent the walk starts only where its user can change anything (`_agent_roots`, once per image), and
covers the whole filesystem as soon as anyone else wrote. Folders root cannot list (root in the
sandbox has no DAC capability) come from the engine's diff, or in a tmpfs work dir from a walk as the
agent; what nobody can list is one opaque change.

`ChangeWalk` is mixed into `Sandbox`: it runs on the sandbox's own harness execs (`_harness`), its
container, config, work dir, start time and the image's cached baseline.
"""

from __future__ import annotations

import bisect
import posixpath
import re
import shlex

import docker
import docker.errors

from ...schemas.common import ChangeSet
from .errors import ChangesTooLarge, OutputTooLarge, SandboxError
from .users import AGENT_UID, USERS

# Never part of a change set: kernel views, the harness's own spool and state files. (The spool names are
# mktemp's: an agent's look-alike in /tmp is not importable by the tests.) Byte code counts wherever it
# is: a `.pyc` runs instead of the source it caches (unchecked-hash ones whatever the source says), so it
# is judged like that source (changes.py: the counterfactual reverts it).
_NOISE = re.compile(r"^/(proc|sys|dev)(/|$)"
                    r"|^/tmp/\.tf-(out|dirs|list|state)\.[A-Za-z0-9]{6}$|^/\.tf-dirs\.[A-Za-z0-9]{6}$"
                    r"|^/usr/sbin/docker-init$")
# Never part of what a writable layer read from outside adds to a change set: the mount points the engine makes in
# every container (its init program, the kernel views). Nothing else: the harness's spool files are gone when the
# layer is read, so a look-alike of theirs is the agent's.
_ENGINE_MOUNTS = re.compile(r"^/(proc|sys|dev)(/|$)|^/(usr/)?sbin/docker-init$")
_PRUNE = r"/ -xdev \( -path /proc -o -path /sys -o -path /dev \) -prune -o"
# (image id, work dir, tmpfs work dir) -> (the paths of its root filesystem, their children by folder, its folders)
_BASELINES: dict[tuple[str, str, bool], tuple[frozenset[str], dict[str, set[str]], frozenset[str]]] = {}
# (image id, work dir mount) -> where the unprivileged agent can change anything (`_agent_roots`);
# None: anywhere (a full walk)
_AGENT_ROOTS: dict[tuple[str, int, tuple[str, ...]], tuple[str, ...] | None] = {}
_BAD_BYTE = re.compile(r"\\x[0-9a-f]{2}")  # how the walk spells a byte of a name that is not UTF-8
MAX_AGENT_ROOTS = 256  # more places than this (an image made writable all over): walk everything
# paths per list of a change set that verification decides on; beyond it the set is `truncated` and no
# pass can be granted on it (verify: `incomplete_evidence`). Display copies keep far fewer (DISPLAY_CAP).
DECISION_CAP = 20_000
DISPLAY_CAP = 200


def inside(path: str, root: str) -> bool:
    """Whether `path` is `root` or lies below it."""
    return path == root or path.startswith(root.rstrip("/") + "/")


def inexact(paths: list[str]) -> list[str]:
    """The change-set paths that do not name one file exactly: a byte that is not UTF-8 is spelled `\\xNN` (records
    are text), as a literal `\\xNN` is, so a revert, a capture or a digest by that text may address another file or
    none. Evidence holding one is incomplete (verify: `incomplete_evidence`): it never decides a pass."""
    return [p for p in paths if _BAD_BYTE.search(p)]


def _opaque_gate(quoted: str) -> str:
    """Shell: an `O` record for each of the (quoted) folders this user cannot list."""
    return f"for p in {quoted}; do [ -r \"$p\" ] && [ -x \"$p\" ] || printf 'O 0 d %s\\0' \"$p\"; done; "


def _has_child(paths: list[str], folder: str, at: int) -> bool:
    """Whether sorted `paths` holds a path below `folder` (which stands at index `at`)."""
    j = bisect.bisect_left(paths, folder + "/", at + 1)
    return j < len(paths) and paths[j].startswith(folder + "/")


class ChangeWalk:
    """The change-walk half of `Sandbox` (see the module docstring)."""

    walk_cap = 64 << 20  # bytes of change-walk records beyond which the change set is the agent's failure
    # the changed paths of the last change set that are no file, folder or link, with find's type letter (`p` a FIFO,
    # `c`/`b` a device, `s` a socket): what the validator records of the reference's outputs (`PathChange.content`)
    special: dict[str, str] = {}

    @property
    def _prune(self) -> str:
        """`find`'s start points and pruning: the root filesystem, plus the work dir when it is its own
        tmpfs (`-xdev` keeps each walk on its start point's filesystem)."""
        return _PRUNE if not self.cfg.work_tmpfs_mb else _PRUNE.replace("/ -xdev", f"/ {shlex.quote(self.workdir)} -xdev", 1)

    def _find(self, script: str, user: str = "0:0", walk: bool = True) -> list[tuple[str, str, str]]:
        """(tag, type, path) of the `<tag> <dev> <type> <path>` records `script` prints (NUL-ended),
        on this container's root filesystem only (every container's overlay has its own device).
        `walk`: a change walk, whose records past `walk_cap` bytes are the agent's doing (ChangesTooLarge)."""
        script = "printf 'R %s d /\\0' \"$(stat -c %d / 2>/dev/null)\"; " + script
        if self.cfg.work_tmpfs_mb:  # the work dir's own tmpfs counts as the root filesystem
            w = shlex.quote(self.workdir)
            # (`O`: the work dir itself cannot be reached or listed, e.g. an agent's `chmod 000 ~`)
            script = f"printf 'W %s d /\\0' \"$(stat -c %d {w} 2>/dev/null)\"; " + _opaque_gate(w) + script
        try:
            # (stderr dropped: a message would land inside a record and lose it)
            _, out = self._harness(["sh", "-c", "exec 2>/dev/null; " + script], user=user, timeout_s=300,
                                   cap=self.walk_cap if walk else 64 << 20)
        except OutputTooLarge as err:
            if walk:
                raise ChangesTooLarge(f"the agent left more changes than the change walk lists: {err}") from None
            raise
        except docker.errors.DockerException as err:
            raise SandboxError(f"could not list the files of {self.name}: {err}") from None
        rows = []
        # a name that is not UTF-8 is kept readable (`\\xff`): Parquet strings and JSON need valid text
        for e in (out or b"").decode("utf-8", errors="backslashreplace").split("\0"):
            tag, _, rest = e.partition(" ")
            dev, _, rest = rest.partition(" ")
            kind, _, path = rest.partition(" ")
            if path:
                rows.append((tag, dev, kind, path))
        root_dev = next((d for t, d, _, _ in rows if t == "R"), None)
        if root_dev is None:
            raise SandboxError(f"could not list the files of {self.name}: {(out or b'')[:200]!r}")
        devs = {root_dev} | {d for t, d, _, _ in rows if t == "W"}
        # (a tmpfs work dir is walked from `/` and from itself: its mount point would come twice)
        kept = {(t, k, p): None for t, d, k, p in rows if (d in devs or t in ("K", "D", "O", "Z")) and t not in ("R", "W")}
        return list(kept)

    def _listing(self) -> dict[str, str]:
        """{path: type} of everything on the container's root filesystem (other mounts, /proc, /sys,
        /dev and bind-mounted files left out)."""
        return {p: k for _, k, p in self._find(f"find {self._prune} -printf 'L %D %y %p\\0' 2>/dev/null", walk=False)
                if p != "/"}

    def _agent_roots(self) -> tuple[str, ...] | None:
        """Where an unprivileged agent can change anything, as the fewest start points of a walk: what
        its user (the agent's own credentials, no capability) may write (`find -writable`: access(2)
        with its uid, groups and ACLs) or owns (chmod, utimes), on the walked filesystems, plus every
        folder it may search but not list (mode 711: what lies below is reachable by name, and its find
        cannot see it: the walk, as root or through the engine's diff, does). A process
        without capabilities changes a file's ctime only by writing it, changing its attributes as its
        owner, or renaming, linking or unlinking it in a folder it may write, so every change it makes
        lies at or below one of these (what it creates lies below a writable folder). None (walk
        everything) when the agent's exec has any effective capability, the image is writable
        everywhere, or there are more than MAX_AGENT_ROOTS places. Once per image."""
        script = ("grep -Eq '^CapEff:[[:space:]]*0+$' /proc/self/status || { echo CAPS; exit 0; }; "
                  f"find {self._prune} \\( -writable -o -user {AGENT_UID} -o -type d -executable ! -readable \\) "
                  "-printf 'A %p\\0' 2>/dev/null; "
                  "echo; echo DONE")
        try:
            _, out = self._harness(["sh", "-c", script], user=USERS["agent"], timeout_s=300)
        except docker.errors.DockerException as err:
            raise SandboxError(f"could not list the agent's writable paths in {self.name}: {err}") from None
        text = (out or b"").decode("utf-8", errors="backslashreplace")
        if not text.rstrip().endswith("DONE") or "CAPS" in text.split("\0")[0]:
            return None
        paths = sorted({e[2:] for e in text.split("\0") if e.startswith("A /")})
        roots: list[str] = []
        for p in paths:  # sorted: an ancestor comes before its descendants
            if p == "/":
                return None
            if roots and inside(p, roots[-1]):
                continue
            roots.append(p)
        return tuple(roots) if len(roots) <= MAX_AGENT_ROOTS else None

    @property
    def _walk(self) -> str:
        """The change walk's start points: the agent's places (`agent_roots`) while only the
        unprivileged agent has written since the start, else the whole root filesystem."""
        if self.agent_roots is None or self.others_wrote:
            return self._prune
        roots = list(self.agent_roots)
        if self.cfg.work_tmpfs_mb and self.workdir not in roots:  # its own filesystem: -xdev stops above it
            roots.append(self.workdir)
        if not roots:
            return "/dev/null -prune -o"  # nothing the agent may change (`/dev/null` is never listed)
        return " ".join(map(shlex.quote, roots)) + " -xdev"

    def _in_work_tmpfs(self, path: str) -> bool:
        return bool(self.cfg.work_tmpfs_mb) and inside(path, self.workdir.rstrip("/"))

    def _with_agent_pass(self, rows: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
        """`rows` of the change walk, plus, for a tmpfs work dir of an unprivileged agent, a walk as the
        agent of the folders there root could not list (its `chmod 700`: root here has no DAC capability,
        and the engine's diff, which covers such folders on the root filesystem, does not see a tmpfs).
        What the agent cannot list either stays `U`/`O`: opaque (`_change_set`)."""
        if self.agent == "root":  # a root agent's harness keeps DAC_READ_SEARCH: root lists everything
            return rows
        hidden = sorted({p for t, _, p in rows if t in ("U", "O") and self._in_work_tmpfs(p)})
        if not hidden:
            return rows
        # the whole work dir when a command line has no room for so many, or when a name may not be what
        # it spells (a byte that is not UTF-8 is spelled `\\xNN`, as a literal `\\xNN` is)
        if len(hidden) > MAX_AGENT_ROOTS or any("\\" in p for p in hidden):
            gate, q = "", shlex.quote(self.workdir)  # (`_find` gates the work dir itself)
        else:
            q = " ".join(map(shlex.quote, hidden))
            gate = _opaque_gate(q)
        second = self._find(gate + self._changes_script(f"{q} -xdev"), user=USERS["agent"])
        # root's `U`/`O` records of the tmpfs are replaced by the agent's (what it, too, cannot list); both walks
        # must have ended for the change set to be complete (their `Z` records)
        both = all(any(r[0] == "Z" for r in w) for w in (rows, second))
        kept = [r for r in rows if not (r[0] in ("U", "O") and self._in_work_tmpfs(r[2]))] + second
        return kept if both else [r for r in kept if r[0] != "Z"]

    def _changes_script(self, start: str | None = None) -> str:
        since = f"-newerct @{self.started_at:.6f}"
        # one walk prints what changed and notes the changed folders; then the entries of those folders
        # (spool files get fresh names: a root agent may have planted links at any fixed one)
        # stderr is dropped: a message ("Permission denied": root here has no DAC capability, and an
        # agent's folder may be mode 700) would land inside a record and lose it
        # (`U`: a folder root cannot read or search here: what changed below it comes from the engine)
        unreadable = "\\( -type d \\( ! -readable -o ! -executable \\) -printf 'U %D %y %p\\0' -o -true \\)"
        # the spool goes to /tmp, or to / when the agent removed or replaced /tmp; the walk ends with a `Z` record, and
        # a change set without it is incomplete (`_change_set`): a walk that could not run never reads as "no change"
        return (f"if d=$(mktemp /tmp/.tf-dirs.XXXXXX 2>/dev/null || mktemp /.tf-dirs.XXXXXX); then "
                f"find {start or self._walk} {unreadable} {since} -printf 'C %D %y %p\\0' "
                "-type d -fprint0 \"$d\" 2>/dev/null; xargs -0 -r -a \"$d\" sh -c 'find \"$@\" -mindepth 1 -maxdepth 1 "
                "-printf \"L %D %y %p\\0\"' _ 2>/dev/null; rm -f \"$d\"; printf 'Z 0 - walked\\0'; fi")

    def changes(self, cap: int = DECISION_CAP) -> ChangeSet:
        """What changed in the container since it started, against its image's file list: deepest
        paths only (a changed file, not the folders above it; a deleted folder, not its content),
        byte-code caches and the harness's own spool files left out. A change is found by its ctime,
        which creating, writing, renaming, chmod-ing or touching a file sets to the current time and
        which no process without CAP_SYS_TIME can set back; a deletion changes its folder's ctime, and
        that folder's entries are compared with the image's list. One walk and a listing of the changed
        folders, filtered in the container (the engine's own diff costs ~0.45 s of daemon CPU per call
        here)."""
        return self._change_set(self._with_agent_pass(self._find(self._changes_script())), cap)

    def _change_set(self, rows: list[tuple[str, str, str]], cap: int) -> ChangeSet:
        complete = any(t == "Z" for t, _, _ in rows)  # the walk ran to its end (`_changes_script`)
        changed = [(k, p) for t, k, p in rows if t == "C"]
        now = {p for t, _, p in rows if t == "L"}
        kinds = {p: k for k, p in changed if p != "/" and not _NOISE.search(p)}
        # folders root cannot list (an agent's chmod 700): what changed below them comes from the engine;
        # in a tmpfs work dir (which the engine does not see) the agent listed them (`_with_agent_pass`), and
        # what it could not list either is opaque: the folder itself counts as changed, whatever is inside
        opaque = sorted({p for t, _, p in rows if t == "O" or (t == "U" and self._in_work_tmpfs(p))})
        hidden = sorted({p for t, _, p in rows if t == "U"} - set(opaque))

        # the engine spells a name that is not UTF-8 with U+FFFD per bad byte, the walk with `\\xNN`: its
        # paths below a hidden folder are matched in the engine's spelling and given the walk's prefix
        # (and as they are: a name may hold a literal `\\x41`, which both spell alike)
        engine_spelling = {h.rstrip("/") + "/": h.rstrip("/") + "/" for h in hidden}
        engine_spelling.update({_BAD_BYTE.sub("\ufffd", h).rstrip("/") + "/": h.rstrip("/") + "/"
                                for h in hidden if _BAD_BYTE.search(h)})

        def below_hidden(q: str) -> str | None:
            """`q` (an engine path) in the walk's spelling, if it lies below a hidden folder."""
            for e, h in engine_spelling.items():
                if q.startswith(e):
                    return h + q[len(e):]
            return None
        dirs = [p for k, p in changed if k == "d" and (p in self.baseline or p == "/") and p not in hidden
                and p not in opaque]
        gone = [c for d in dirs for c in self.children.get(d, ()) if c not in now and not _NOISE.search(c)]
        engine_modified: list[str] = []
        if hidden:  # what changed below them: the engine's diff (complete; ~0.45 s of daemon CPU, so only here)
            diff = {w: k for q, k in self._engine_diff().items() if (w := below_hidden(q)) and not _NOISE.search(w)}
            parents = {posixpath.dirname(q) for q in diff}
            for q, k in diff.items():
                folder = q in parents or q in self.baseline_dirs
                if k == "deleted":
                    gone.append(q)
                elif k == "added":
                    kinds[q] = "d" if folder else "f"
                elif not folder:  # (the baseline may not know what lies below an unreadable folder)
                    engine_modified.append(q)
        if opaque:  # (nothing below one is known: it stands for all of it)
            def below_opaque(q: str) -> bool:
                return any(q != p and inside(q, p) for p in opaque)
            kinds = {q: k for q, k in kinds.items() if not below_opaque(q)}
            gone = [q for q in gone if not below_opaque(q)]
            kinds.update({p: "f" if p in self.baseline else "d" for p in opaque})
        gone = sorted(set(gone))
        self.special = {p: k for p, k in kinds.items() if k in ("p", "c", "b", "s")}
        added = sorted(p for p in kinds if p not in self.baseline)
        modified = sorted({p for p, k in kinds.items() if p in self.baseline and k != "d"} | set(engine_modified))
        # an added folder is listed only when nothing was added inside it (sorted: its first child, if
        # any, is the first path at or after `folder/`)
        added = [p for i, p in enumerate(added) if not (kinds[p] == "d" and _has_child(added, p, i))]
        total = len(added) + len(modified) + len(gone)
        return ChangeSet(added=added[:cap], modified=modified[:cap], deleted=gone[:cap], total=total,
                         truncated=max(len(added), len(modified), len(gone)) > cap or not complete)

    def with_layer(self, changes: ChangeSet, layer: dict[str, str] | None, cap: int) -> ChangeSet:
        """`changes` (the walk's) joined with what the container's writable layer holds that the walk did not list
        (`layer`: {path: added | modified | deleted | replaced}, read from outside, `Sandbox.layer_changes`): what a
        commit carries and the tests could read is in the change set, so it is captured, checksummed and reverted
        like the rest, whatever the walk left out (a name like its own spool's, a folder nobody could list, a path
        outside an unprivileged agent's places). Deepest paths, as the walk gives them. None: no outside view of
        the layer (the walk's own set)."""
        if not layer:
            return changes
        listed = set(changes.added) | set(changes.modified) | set(changes.deleted)
        extra: dict[str, str] = {}
        added = sorted({p for p, k in layer.items() if k == "added"} | set(changes.added))
        for p, kind in layer.items():
            if p in listed or _ENGINE_MOUNTS.search(p):
                continue
            if kind == "replaced":  # made anew: what the image had below it and the layer does not hold is gone
                extra.update({c: "deleted" for c in self.children.get(p, ()) if c not in layer and c not in listed})
            elif kind != "added" or not _has_child(added, p, bisect.bisect_left(added, p)):
                extra[p] = kind
        if not extra:
            return changes
        lists = {k: set(getattr(changes, k)) for k in ("added", "modified", "deleted")}
        for p, kind in extra.items():
            lists[kind].add(p)
        out = {k: sorted(v) for k, v in lists.items()}
        # (the engine's diff spells a byte that is not UTF-8 as U+FFFD: no revert or capture could address it)
        return ChangeSet(**{k: v[:cap] for k, v in out.items()}, total=changes.total + len(extra),
                         truncated=changes.truncated or any(len(v) > cap for v in out.values())
                         or any("\ufffd" in p for p in extra))

    def _engine_diff(self) -> dict[str, str]:
        """{path: added | modified | deleted} from the engine's diff of the container's writable layer
        (the root filesystem only: a tmpfs work dir is not in it)."""
        try:
            rows = self.client.api.diff(self.container.id) or []
        except docker.errors.DockerException as err:
            raise SandboxError(f"could not diff {self.name}: {err}") from None
        return {r["Path"]: ("modified", "added", "deleted")[r["Kind"]] for r in rows}
