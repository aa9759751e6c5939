"""What an episode did to the programs the harness runs, read from outside the container.

Threat model (docs/verification.md): after an episode nothing inside its container is trusted: a
root agent may have replaced `sh`, `find`, `python3` or a library they load. Every later harness step
(the change walk, the checksums, the hidden tests' runner) runs programs of that container, so before
any of them runs, `toolchain_changes` says from outside whether the agent changed one of them:
- on the engine's own host (overlay2, this process may read the engine's data root: a local engine run
  as root), by reading the container's writable layer (the overlay *upper* folder) directly: a few
  `lstat` calls, nothing runs in the container;
- elsewhere, from the engine's diff of the writable layer (`GET /containers/{id}/changes`, ~1 s of
  daemon CPU here).
Both are views the agent cannot reach. A change found there that the reference solution did not make is
`toolchain_tamper`: the episode is never judged by its container's programs (no in-place test run, no
isolated one either: restoring its state would restore the shims) and never counts as a pass.
"""

from __future__ import annotations

import fnmatch
import os
import posixpath
import re
import stat

from .walk import inside

# The system folders whose programs and libraries the harness (and a task's test interpreter) runs.
BIN_DIRS = ("/bin", "/sbin", "/usr/bin", "/usr/sbin")
LIB_DIRS = ("/lib", "/lib32", "/lib64", "/libx32", "/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/libexec")
LOADER = ("/etc/ld.so.preload", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/ld.so.cache")
SYSTEM = BIN_DIRS + LIB_DIRS + LOADER
# The PATH of every harness exec: the image's own system folders, never /usr/local (where imported tasks'
# solutions legitimately install programs) and never the agent's PATH.
HARNESS_PATH = "/usr/bin:/bin:/usr/sbin:/sbin"
_WHITEOUT_XATTR = "trusted.overlay.opaque"


def under(path: str, roots: tuple[str, ...]) -> bool:
    """Whether `path` is or lies below one of `roots`."""
    return any(inside(path, r) for r in roots)


def judged(path: str, kind: str, baseline: frozenset[str]) -> bool:
    """Whether a change (`kind`: added / modified / deleted / replaced) of `path` touches the trusted
    toolchain: anything modified or deleted in a system folder, a folder above one deleted or replaced
    (made anew, so the image's content below it is gone), anything added below a library folder or the
    loader's configuration, and an addition in a bin folder that takes the name of a program the image
    has in another one (it would come first on some PATH)."""
    if kind in ("deleted", "replaced") and any(r.startswith(path.rstrip("/") + "/") for r in SYSTEM):
        return True
    if kind != "added":
        return under(path, SYSTEM)
    if _python_module(path):
        return False
    if under(path, LIB_DIRS + LOADER):
        return True
    if posixpath.dirname(path) in BIN_DIRS:
        name = posixpath.basename(path)
        return any(posixpath.join(d, name) in baseline for d in BIN_DIRS if d != posixpath.dirname(path))
    return False


def spelled(name: bytes) -> str:
    """A name as the change walk spells it: bytes that are not UTF-8 as `\\xNN` (records are text)."""
    return name.decode("utf-8", "backslashreplace")


def layer_entries(upper: str) -> dict[str, str]:
    """{path: present | opaque | deleted} of EVERYTHING in an overlay upper folder (host side, never following a
    link; names spelled as the walk spells them): what a commit of the container carries, whatever any walk inside
    it saw. A whiteout (character device 0:0) is a deletion, an opaque folder replaced what the image had below."""
    out: dict[str, str] = {}
    root = os.fsencode(upper)
    stack = [b"/"]
    while stack:
        rel = stack.pop()
        try:
            with os.scandir(root + rel) as it:
                entries = list(it)
        except (FileNotFoundError, NotADirectoryError):
            continue
        for e in entries:
            path = rel.rstrip(b"/") + b"/" + e.name
            try:
                st = e.stat(follow_symlinks=False)
            except FileNotFoundError:  # (a live container's layer: gone since the folder was listed)
                continue
            name = spelled(path)
            if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
                out[name] = "deleted"
            elif stat.S_ISDIR(st.st_mode):
                try:
                    opaque = os.getxattr(e.path, _WHITEOUT_XATTR, follow_symlinks=False) == b"y"
                except OSError:
                    opaque = False
                out[name] = "opaque" if opaque else "present"
                stack.append(path)
            else:
                out[name] = "present"
    return out


# Python's system import folder: a module added there is judged like one in /usr/local (the harness's own Python runs
# with -I, so the standard library comes first; pytest's plugins are not autoloaded in trajforge's own sessions),
# except what runs at every start-up or shadows what the harness imports
PY_SYSTEM = re.compile(r"^/usr/lib/python3(\.\d+)?/dist-packages/(?P<top>[^/]+)")
HARNESS_MODULES = {"pytest", "_pytest", "pluggy", "iniconfig", "packaging", "py", "py.py", "pytest.py", "_pytest.py"}


def _python_module(path: str) -> bool:
    """Whether `path` is a module file added to Python's system import folder that no start-up runs (no `.pth`,
    `sitecustomize`, `usercustomize`) and that shadows nothing the harness imports."""
    m = PY_SYSTEM.match(path)
    if not m:
        return False
    top = m["top"]
    return not (top.endswith(".pth") or top.split(".")[0] in ("sitecustomize", "usercustomize")
                or top in HARNESS_MODULES or top.split(".")[0] in HARNESS_MODULES)


def upper_changes(upper: str) -> dict[str, str]:
    """{path: present | opaque | deleted} below the system folders, from an overlay upper folder (`layer_entries`,
    read the same way): a whiteout is a deletion, an opaque folder replaced everything below it, anything else was
    added or copied up (modified when the image had it: the caller decides with its baseline). `/usr` and `/etc`
    themselves, the folders above the system ones, only when replaced (opaque), deleted or no longer a folder."""
    entries = layer_entries(upper)
    out = {p: k for p, k in entries.items() if under(p, SYSTEM)}
    for top in ("/usr", "/etc"):
        kind = entries.get(top)
        try:
            replaced = kind in ("opaque", "deleted") or (kind == "present"
                                                         and not stat.S_ISDIR(os.lstat(upper + top).st_mode))
        except FileNotFoundError:  # (a live container's layer: gone since it was walked)
            replaced = False
        if replaced:
            out[top] = kind
    return out


def classify(raw: dict[str, str], baseline: frozenset[str], baseline_dirs: frozenset[str]) -> dict[str, str]:
    """A layer's entries ({path: present | opaque | deleted} from `upper_changes`, or the engine's
    {path: added | modified | deleted}) as {path: added | modified | deleted | replaced} against the
    image: a folder of the image that is merely there again (copied up, or `modified` because something
    below it changed) is no change by itself; its entries say what changed."""
    out = {}
    for path, how in raw.items():
        if how == "deleted":
            out[path] = "deleted"
        elif how == "opaque":  # removed and made again: everything the image had below it is gone
            out[path] = "replaced" if path in baseline else "added"
        elif path in baseline_dirs:
            continue
        else:
            out[path] = "modified" if path in baseline else "added"
    return out


def allowed(path: str, patterns: tuple[str, ...]) -> bool:
    """Whether `path` is, lies below, or matches one of `patterns` (the reference solution's changes)."""
    return any(inside(path, e) or fnmatch.fnmatch(path, e) for e in patterns)


def toolchain_changes(changes: dict[str, str], baseline: frozenset[str], expected: tuple[str, ...] = ()) -> list[str]:
    """The paths of `changes` ({path: added|modified|deleted|replaced}) that touch the trusted toolchain,
    except what the reference solution changed too (`expected`: the task needs it)."""
    return sorted(p for p, k in changes.items() if judged(p, k, baseline) and not allowed(p, expected))


def folder_changes(upper: str, lowers: list[str], baseline_dirs: frozenset[str]) -> dict[str, str]:
    """{folder: modified} for each folder of the image whose owner, group or mode the container changed, read on the
    engine's host: its entry in the writable layer (`upper`) against the topmost image layer (`lowers`, top first)
    that holds it. A folder merely copied up (something below it changed) keeps the image's metadata: no change."""
    out: dict[str, str] = {}
    for root, dirs, _ in os.walk(upper):
        for name in dirs:
            host = os.path.join(root, name)
            path = host[len(upper):]
            if path not in baseline_dirs:
                continue
            try:
                mine = os.lstat(host)
            except FileNotFoundError:
                continue
            for lower in lowers:
                try:
                    theirs = os.lstat(lower + path)
                except (FileNotFoundError, NotADirectoryError):
                    continue
                if (mine.st_uid, mine.st_gid, stat.S_IMODE(mine.st_mode)) != \
                        (theirs.st_uid, theirs.st_gid, stat.S_IMODE(theirs.st_mode)):
                    out[path] = "modified"
                break
    return out
