"""Running one command in a sandbox with bounded output and a client-side deadline.

In the container, `CAPTURE` (a small `python3 -I -S` program, the exec's only process) runs the
command in its own process group with stdin from /dev/null and stdout+stderr on a pipe, keeps the
first and last bytes of that stream (never the whole of it: nothing is spooled to disk, memory is
bounded by the output limit), counts the total, SIGKILLs the whole group at the timeout and reads the
memory cgroup's OOM-kill counter before and after. When the command has exited but something it
started (a background job, a `setsid` process) still holds the pipe, the program stops reading after
a short drain and hands the pipe to a detached drainer that discards what follows (a background
server keeps running and its logging never blocks or fills a disk). It makes itself non-dumpable, so
processes of the same user cannot open the exec's own output through /proc/<pid>/fd.

On the client, `run_exec` reads the exec's stream with a deadline (docker-py's own reader polls with
no timeout: a process holding the stream would block it forever) and a byte cap; past the deadline it
raises `ExecHung` and the caller kills the processes that may hold the stream.
Trust: like the shell wrapper it replaces, it relies on the image's `python3` (a root agent could
replace it: the command's outcome is then whatever the agent makes it say, never the harness's state).
"""

from __future__ import annotations

import select
import socket
import time

import docker.errors
from docker.utils.socket import read as socket_read

META = b"\n__TF_META__ "

CAPTURE = r'''
import os, select, signal, sys, time
def ooms():
    for p in ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control"):
        try:
            with open(p) as f:
                for line in f:
                    k, _, v = line.partition(" ")
                    if k == "oom_kill":
                        return int(v)
        except (OSError, ValueError):
            pass
    return 0
try:
    import ctypes
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: /proc/<pid>/fd/1 is not the agent's
except Exception:
    pass
limit, timeout = int(sys.argv[1]), float(sys.argv[2])
half, keep = limit // 2, limit - limit // 2
out = sys.stdout.buffer
o1 = ooms()
r, w = os.pipe()
try:
    pid = os.posix_spawnp(sys.argv[3], sys.argv[3:], os.environ, setpgroup=0,
                          setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),
                          file_actions=[(os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                                        (os.POSIX_SPAWN_DUP2, w, 1), (os.POSIX_SPAWN_DUP2, w, 2)])
except OSError as err:
    out.write(b"cannot start the command (fork: %s)\n__TF_META__ 126 0 0 0\n" % str(err).encode())
    sys.exit(0)
os.close(w)
try:
    pfd = os.pidfd_open(pid)
except (AttributeError, OSError):
    pfd = None
head, tail, total = bytearray(), bytearray(), 0
deadline = time.monotonic() + timeout
status, killed, eof, drain_until = None, False, False, 0.0
while True:
    now = time.monotonic()
    if status is None:
        if not killed and now >= deadline:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
            killed = True
        wait = max(0.0, deadline - now) if not killed else 1.0
        if pfd is None:
            wait = min(wait, 0.05)
        fds = [r] if pfd is None else [r, pfd]
    else:
        wait, fds = max(0.0, drain_until - now), [r]
    ready = select.select(fds, [], [], wait)[0]
    if r in ready:
        data = os.read(r, 65536)
        if not data:
            eof = True
            break
        total += len(data)
        if len(head) < half:
            n = half - len(head)
            head += data[:n]
            data = data[n:]
        tail += data
        if len(tail) > 4 * keep + 65536:
            del tail[:len(tail) - keep]
    if status is None:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status, drain_until = st, time.monotonic() + 0.25
    elif time.monotonic() >= drain_until:
        break
if status is None:
    status = os.waitpid(pid, 0)[1]
if not eof:  # something the command started holds the pipe: a detached drainer reads it from now on
    try:
        if os.fork() == 0:
            os.setsid()
            n = os.open("/dev/null", os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(n, fd)
            try:
                while os.read(r, 65536):
                    pass
            finally:
                os._exit(0)
    except OSError:
        pass  # no process left (pids limit): the holders get SIGPIPE instead
ec = 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
tail = tail[-keep:]
if total > limit:
    out.write(bytes(head) + b"\n[... %d bytes truncated ...]\n" % (total - len(head) - half) + bytes(tail[-half:]))
else:
    out.write(bytes(head) + bytes(tail))
out.write(b"\n__TF_META__ %d %d %d %d\n" % (ec, total, ooms() - o1, killed))
'''


class ExecHung(RuntimeError):
    """The exec's stream did not end by the client-side deadline (something holds it open)."""

    def __init__(self, partial: bytes):
        super().__init__("exec stream still open at the deadline")
        self.partial = partial


def capture_argv(command: str, timeout_s: float, limit: int) -> list[str]:
    """The exec's argv: `CAPTURE` running `bash -c command`."""
    return ["python3", "-I", "-S", "-c", CAPTURE, str(limit), f"{timeout_s:g}", "bash", "-c", command]


def _frames(buf: bytearray) -> tuple[bytes, bytearray]:
    """Payloads of the complete multiplexed frames (8-byte header: stream, 0, 0, 0, size) in `buf`."""
    out, i = bytearray(), 0
    while len(buf) - i >= 8:
        size = int.from_bytes(buf[i + 4:i + 8], "big")
        if len(buf) - i - 8 < size:
            break
        out += buf[i + 8:i + 8 + size]
        i += 8 + size
    return bytes(out), buf[i:]


def run_exec(api, container_id: str, argv: list[str], deadline: float, cap: int, **kw) -> tuple[int | None, bytes]:
    """Run `argv` in the container; (exit code, stdout+stderr). At most `cap` bytes are kept (the first
    `cap // 2` and the last `cap // 2`). Raises ExecHung when the stream is still open at `deadline`
    (time.monotonic()); docker errors pass through as DockerException."""
    exec_id = api.exec_create(container_id, argv, stdout=True, stderr=True, **kw)["Id"]
    sock = api.exec_start(exec_id, socket=True)
    head, tail, pending = bytearray(), bytearray(), bytearray()
    try:
        fd = sock.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLPRI | select.POLLHUP)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ExecHung(bytes(head + tail))
            buffered = getattr(sock, "pending", None)  # a TLS socket may hold decrypted bytes poll cannot see
            if not (buffered and buffered()) and not poller.poll(min(left, 60.0) * 1000):
                continue
            data = socket_read(sock, 65536)
            if not data:
                break
            payload, pending = _frames(pending + data)
            room = cap // 2 - len(head)
            if room > 0:
                head += payload[:room]
                payload = payload[room:]
            tail += payload
            if len(tail) > 2 * cap:
                del tail[:len(tail) - cap // 2]
    finally:  # drop the connection (a hung exec's daemon side then stops copying into it)
        for close in (lambda: getattr(sock, "_sock", sock).shutdown(socket.SHUT_RDWR), sock.close):
            try:
                close()
            except Exception:
                pass
    try:
        code = api.exec_inspect(exec_id).get("ExitCode")
    except docker.errors.DockerException:
        code = None
    return code, bytes(head + tail[-(cap // 2):] if len(head) + len(tail) > cap else head + tail)
