"""The protected paths' checksum script, run inside a sandbox as root with `python3 -I -c DIGEST GLOB...`
in the work dir, before the agent's first command (once per image) and at settle: {path: digest} as
JSON. It walks the work dir itself (no glob): it follows no link and opens only regular files, so
nothing the agent leaves (a link to /dev/zero or a FIFO, a link loop) can hang or blow it up; a link
is checksummed as a link, other special files by their type. A regular file's digest covers its size
and its data extents (holes skipped: sparse files cost nothing), and a file with many hard links is
read once."""

import hashlib
import shlex


def file_digest(data: bytes) -> str:
    """What DIGEST gives a regular file holding `data` without holes (every file a program writes front to back):
    computed on the host, to compare with a sandbox's `digests`."""
    h = hashlib.sha256(b"%d:" % len(data))
    if data:
        h.update(b"@0:" + data)
    return h.hexdigest()


def digest_command(globs: list[str]) -> str:
    """The shell command that prints the checksums of `globs`, run in the work dir."""
    return f"/usr/bin/python3 -I -c {shlex.quote(DIGEST)} {' '.join(map(shlex.quote, globs))}"


DIGEST = r"""
import errno, fnmatch, hashlib, json, os, stat, sys
MAX = 20000  # entries; beyond that one "<more>" entry counts the rest (the same cap before and after)
pats = [[s for s in p.split("/") if s not in ("", ".")] for p in sys.argv[1:]]
def match(parts, pat):  # `**` is zero or more folders; `*` also matches names that start with a dot
    if not pat:
        return not parts
    if pat[0] == "**":
        return any(match(parts[i:], pat[1:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], pat[0]) and match(parts[1:], pat[1:])
def could(parts, pat):  # whether something below folder `parts` may match
    if not parts or (pat and pat[0] == "**"):
        return True
    return bool(pat) and fnmatch.fnmatchcase(parts[0], pat[0]) and could(parts[1:], pat[1:])
def digest(path, st):  # never follows a link, never opens what is not a regular file
    if stat.S_ISLNK(st.st_mode):
        return "link:" + hashlib.sha256(os.fsencode(os.readlink(path))).hexdigest()
    if not stat.S_ISREG(st.st_mode):
        return "special:%o:%d" % (stat.S_IFMT(st.st_mode), st.st_rdev)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return "special:swapped"
        return content(fd)
    finally:
        os.close(fd)
def content(fd):  # the size and each data extent (holes are skipped: a sparse 1 TB file is read in no time)
    size = os.fstat(fd).st_size
    h, off = hashlib.sha256(b"%d:" % size), 0
    while off < size:
        try:
            start = os.lseek(fd, off, os.SEEK_DATA)
            end = os.lseek(fd, start, os.SEEK_HOLE)
        except OSError as err:
            if err.errno == errno.ENXIO:  # no data past `off`
                break
            start, end = off, size  # no extent map here: read it all
        h.update(b"@%d:" % start)
        os.lseek(fd, start, os.SEEK_SET)
        while start < end:
            chunk = os.read(fd, min(end - start, 1 << 20))
            if not chunk:
                break
            h.update(chunk)
            start += len(chunk)
        off = max(end, off + 1)
    return h.hexdigest()
seen = {}  # (device, inode) -> digest: a file with many hard links is read once
out, more, stack = {}, 0, [()]
while stack:  # no link is followed: a link to a folder, /dev/zero or a FIFO is one entry, a loop is none
    folder = stack.pop()
    try:
        entries = sorted(os.scandir("/".join(folder) or "."), key=lambda e: e.name)
    except OSError:
        continue  # a folder root cannot list: what matched below it is missing, which counts as changed
    for e in entries:
        parts = folder + (e.name,)
        try:
            st = os.lstat(e.path)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode):
            if any(could(parts, p) for p in pats):
                stack.append(parts)
        elif any(match(list(parts), p) for p in pats):
            if len(out) >= MAX:
                more += 1
                continue
            key = (st.st_dev, st.st_ino)
            if key not in seen:
                try:
                    seen[key] = digest(e.path, st)
                except OSError:
                    seen[key] = "unreadable"
            out["/".join(parts)] = seen[key]
if more:
    out["<more>"] = str(more)
print(json.dumps(out, sort_keys=True))
"""
