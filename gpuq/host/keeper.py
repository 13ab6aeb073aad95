"""One job under its keeper: root's part of a job's life (docs/security.md, "What runs as root").

The starter (host/privsep.py) forks a keeper for each job it is ordered to start, once it has
checked the order. The keeper is the job's parent, in a session of its own, as child subreaper
(the job's orphans stay its own). It forks the job, whose process drops to its owner
(`setgroups`, `setgid`, `setuid`) before it opens its log, enters its workdir or executes
anything, and holds nothing but its stdin, stdout and stderr; it signals the job's process
group when the supervisor asks (never a pid read from anywhere); it stops the job itself once
the box's lease is too old (the worker is gone or cut off: other boxes will soon run the job
again); it ends what the job left behind, and writes the exit status into the exit file and
on the supervisor's socket. It holds the attempt's liveness lock all along, without reading
it: the lock is free once the keeper is gone. Root opens no path of a member's here: what the
keeper reads or writes is a descriptor the queue account opened and handed over.

Runs as root: start_keeper, keep, _watch, _signal_job, _kill, _end_leftovers, _leftovers,
_reap_leftovers, _children, _open_fds, _close, and _job until it has dropped to the owner.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import select
import signal
import socket
import stat
import time
from typing import NoReturn

from gpuq.host.wire import Identity, Refused, lease_age, libc, receive, send

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
POLL_S = 0.05  # how often a keeper on a kernel without pidfd_open looks whether its job exited
LEFTOVER_WAIT_S = 5.0  # what a job left behind gets SIGTERM, then this long at most, then SIGKILL
SIGNALS_ALLOWED = (signal.SIGTERM, signal.SIGKILL, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def start_keeper(reply: socket.socket, order: dict, fds: dict[str, int]) -> None:
    """As root: fork the keeper of one job; it answers on `reply` from now on."""
    pid = os.fork()
    if pid:
        return
    code = 1
    try:
        keep(reply, order, fds)
        code = 0
    except BaseException as e:
        try:
            send(reply, {"error": f"the keeper failed: {e}"}, [])
        except OSError:
            pass
    os._exit(code)


def keep(chan: socket.socket, order: dict, fds: dict[str, int]) -> None:
    """As root: one job's keeper, in its own session as child subreaper (the job's orphans stay
    its own). Forks the job; tells the supervisor on `chan` its pid and hands over the log the
    job opened; signals the job's process group when the supervisor asks; stops the job itself
    once the box's lease is `fence_after_s` old (the worker is gone or cut off: other boxes will
    soon run this job again); when the job is over, ends what it left behind, writes the exit
    status into the exit file and on `chan`, and exits. Holds the job lock (`fds["lock"]`)
    all along without reading it: the lock is free once this keeper is gone."""
    os.setsid()
    libc().prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    keep_fds = {chan.fileno(), *fds.values()}
    for fd in _open_fds():
        if fd > 2 and fd not in keep_fds:
            _close(fd)
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL if sig == signal.SIGCHLD else signal.SIG_IGN)
    _close(fds.pop("spec", -1))  # it was shown to the starter; the job never gets it
    report, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        report.close()
        _job(order, child_end, fds.get("logs"))
    child_end.close()
    _close(fds.pop("logs", -1))
    handed: dict[str, int] = {}  # "log", "out": what the job opened for its supervisor
    error = None
    while True:  # until the job's exec closes its end: it sends its log, or why it cannot start
        try:
            message, got = receive(report)
        except (OSError, Refused):
            break
        if message is None:
            break
        if "error" in message:
            error = str(message["error"])
        for name, fd in zip([k for k in ("log", "out") if message.get(k)], got):
            handed[name] = fd
    report.close()
    names = sorted(handed)
    if error is not None:
        os.waitpid(pid, 0)
        send(chan, {"error": error, "fds": names}, [handed[n] for n in names])
        return
    send(chan, {"started": pid, "keeper": os.getpid(), "fds": names}, [handed[n] for n in names])
    for fd in handed.values():
        os.close(fd)
    status, fenced = _watch(chan, pid, order, fds.get("lease"))
    _end_leftovers(pid, order["grace_s"])
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # the job's whole tree: nothing else was ours
    result = {"status": status, "fenced": fenced, "cpu_s": usage.ru_utime + usage.ru_stime, "ended_at": time.time()}
    if "exit" in fds:
        try:
            data = json.dumps(result).encode()
            os.pwrite(fds["exit"], data.ljust(max(len(data), 256)), 0)
        except OSError:
            pass  # its supervisor hears it below; without either the attempt is "exit unknown"
    try:
        send(chan, result, [])
    except OSError:
        pass  # the supervisor is gone: its worker reads the exit file


def _watch(chan: socket.socket, pid: int, order: dict, lease_fd: int | None) -> tuple[int, bool]:
    """As root: wait for job `pid` to exit; signal its group on the supervisor's word; stop it
    once the lease is too old. Returns (its wait status, whether the keeper fenced it)."""
    try:
        pidfd: int | None = os.pidfd_open(pid)  # readable once the job has exited
    except OSError:
        pidfd = None  # a kernel before 5.3: look every POLL_S
    listening: socket.socket | None = chan
    fenced, kill_at = False, float("inf")
    fence_after = order["fence_after_s"]
    check_every = min(5.0, fence_after / 6) if fence_after else None
    next_check = time.monotonic() + (check_every or 0)
    while True:
        now = time.monotonic()
        due = min(kill_at, next_check if check_every else float("inf"), now + POLL_S if pidfd is None else float("inf"))
        waits = ([pidfd] if pidfd is not None else []) + ([listening] if listening else [])
        ready, _, _ = select.select(waits, [], [], None if due == float("inf") else max(0.0, due - now))
        if (pidfd is not None and pidfd in ready) or (pidfd is None and _has_exited(pid)):
            break
        if listening in ready:
            try:
                message, got = receive(listening)
            except (OSError, Refused):
                message, got = None, []
            for fd in got:
                _close(fd)
            if message is None:
                listening = None  # the supervisor is gone; the lease alone fences the job now
            elif message.get("signal") in SIGNALS_ALLOWED:
                _signal_job(pid, int(message["signal"]))
        now = time.monotonic()
        if check_every and now >= next_check:
            next_check = now + check_every
            age = lease_age(lease_fd) if lease_fd is not None else None
            if not fenced and age is not None and age > fence_after:
                fenced, kill_at = True, now + order["grace_s"]
                _signal_job(pid, signal.SIGTERM)
        if now >= kill_at:
            kill_at = float("inf")
            _signal_job(pid, signal.SIGKILL)
    _close(pidfd if pidfd is not None else -1)
    # Reaped now: what is left of its group keeps the group's id in use (no new process can
    # take it), so the keeper can still tell, and signal, only the job's leftovers.
    _, status = os.waitpid(pid, 0)
    return status, fenced


def _has_exited(pid: int) -> bool:
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None  # left to reap


def _signal_job(pid: int, sig: int) -> None:
    """The job's process group (the keeper made it: while the leader is its unreaped child, or
    any member is left, the group's id cannot name anyone else's); SIGKILL reaches the
    keeper's other children too (orphans it adopted). No other process is ever signalled."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    if sig == signal.SIGKILL:
        for child in _children():
            if child != pid:
                _kill(child, sig)


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _end_leftovers(pid: int, grace_s: float) -> None:
    """As root: what the job left behind (its group, and the orphans this keeper adopted as
    subreaper: a leftover whose parent dies becomes the keeper's own child) gets SIGTERM, a
    short wait, SIGKILL, round after round until none is left; then every child is reaped.
    Only the keeper's own process group and children are signalled: their ids stay theirs
    until the keeper reaps them."""
    if _leftovers(pid):
        _signal_job(pid, signal.SIGTERM)
        for child in _children():
            if child != pid:
                _kill(child, signal.SIGTERM)
        deadline = time.monotonic() + min(grace_s, LEFTOVER_WAIT_S)
        while time.monotonic() < deadline and _leftovers(pid):
            _reap_leftovers(keep=pid)
            time.sleep(0.05)
        while _leftovers(pid):
            _signal_job(pid, signal.SIGKILL)
            _reap_leftovers(keep=pid)
            time.sleep(0.02)
    while True:
        try:
            if os.waitpid(-1, 0)[0] == 0:
                return
        except ChildProcessError:
            return


def _leftovers(pid: int) -> bool:
    """Whether anything of the job is left (its leader reaped): a process in its group, or
    another child of the keeper's."""
    try:
        os.killpg(pid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return any(child != pid for child in _children())


def _reap_leftovers(keep: int) -> None:
    """Reap the children that have exited."""
    for child in _children():
        if child != keep:
            try:
                os.waitpid(child, os.WNOHANG)
            except ChildProcessError:
                pass


def _children() -> list[int]:
    """The keeper's own children, from /proc/self (root's)."""
    found: list[int] = []
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children", "rb") as f:
                found += [int(c) for c in f.read().split()]
    except (OSError, ValueError):
        pass
    return found


def _open_fds() -> list[int]:
    try:
        return [int(fd) for fd in os.listdir("/proc/self/fd")]
    except OSError:
        return list(range(3, 256))


def _close(fd: int) -> None:
    if fd >= 0:
        try:
            os.close(fd)
        except OSError:
            pass


def _exit_where_a_shell_would(order: dict, report: socket.socket) -> None:
    """In the job's process: a bare command name that a shell would not run from the job's
    PATH ends it as a shell does: its words in the log, exit 127 (not found) or 126 (found, not
    runnable). exec named the last directory it could not search instead ("Permission denied:
    nosuchcmd", of a command that is nowhere), and the record had no exit status."""
    command = order["argv"][0]
    path = order["env"].get("PATH", os.defpath)  # none at all: exec's own default, as it would search
    if "/" in command or (refused := _shell_would_refuse(command, path)) is None:
        return
    os.write(2, f"gpuq: {command}: {refused[1]}\n".encode())
    report.close()  # as the exec would: it started, and ends at once
    os._exit(refused[0])


def _shell_would_refuse(command: str, path: str) -> tuple[int, str] | None:
    """(126 or 127, a shell's words) where a shell would not run `command` (a bare name) from
    `path`, as the job's owner: no runnable file by that name in any of its directories (an
    empty entry is the workdir, as for sh). None where it would."""
    found = False
    for directory in path.split(os.pathsep):
        candidate = os.path.join(directory or ".", command)
        if os.path.isfile(candidate):
            if os.access(candidate, os.X_OK):
                return None
            found = True
    return (126, "Permission denied") if found else (127, "command not found")


def _job(order: dict, report: socket.socket, logs_fd: int | None) -> NoReturn:
    """In the job's process, forked by its keeper (root): its own process group; then the
    owner's groups, gid and uid for good, before anything of the owner's is touched: the log
    is opened, the workdir entered and the command executed as the owner. What goes wrong is
    told to the keeper over `report`, which the exec closes."""
    who: Identity = order["who"]
    step = "start"
    try:
        os.setpgid(0, 0)
        if os.geteuid() == 0 and who.uid != 0:
            step = "switch to the job's owner"
            os.setgroups(list(who.groups))
            os.setgid(who.gid)
            os.setuid(who.uid)
        libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # its keeper killed: so is the job
        log_fd = None
        if order["log"] is not None and logs_fd is not None:
            step = f"open its log logs/{order['log']}"
            log_fd = _open_log(logs_fd, order["log"], who)
            try:
                os.write(log_fd, order["header"].encode())
            except OSError:
                pass  # a full disk: the job runs all the same, its result is recorded
            socket.send_fds(report, [b'{"log": true}'], [log_fd])
        step = "enter its workdir"
        try:
            os.chdir(order["cwd"])
        except OSError as e:
            if e.errno in (errno.EACCES, errno.EPERM):
                raise OSError(
                    e.errno, f"workdir {order['cwd']} is not accessible to {who.name} ({e.strerror})"
                ) from None
            raise OSError(e.errno, f"{e.strerror} (workdir): {order['cwd']}") from None
        devnull = os.open(os.devnull, os.O_RDWR)
        stdin = devnull
        if order["stdin"] is not None:  # a file of the owner's own (sbatch's script, an env file)
            stdin = os.memfd_create("gpuq-stdin")
            os.write(stdin, order["stdin"].encode())
            os.lseek(stdin, 0, os.SEEK_SET)
        out = log_fd if log_fd is not None else devnull
        if order["capture"]:  # a helper's output, for its supervisor to read
            read_end, out = os.pipe()
            socket.send_fds(report, [b'{"out": true}'], [read_end])
            os.close(read_end)
        os.dup2(stdin, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        for fd in _open_fds():
            if fd > 2 and fd != report.fileno():
                _close(fd)
        for sig in signal.valid_signals():
            if sig not in (signal.SIGKILL, signal.SIGSTOP) and sig < signal.SIGRTMIN:
                signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        if order["cores"]:
            os.sched_setaffinity(0, order["cores"])
        step = "run its command"
        _exit_where_a_shell_would(order, report)
        try:
            os.execvpe(order["argv"][0], order["argv"], order["env"])
        except OSError as e:
            raise OSError(e.errno, e.strerror, order["argv"][0]) from None
    except OSError as e:  # the workdir's and the log's own words say what and whose; exec's name the file
        why = f"{e.strerror}: {e.filename}" if e.filename else (e.strerror or str(e))
        if step in ("start", "switch to the job's owner"):
            why = f"{step}: {why}"
    except BaseException as e:
        why = f"{step}: {e}"
    try:
        report.send(json.dumps({"error": why}).encode())
    except OSError:
        pass
    os._exit(127)


def _open_log(logs_fd: int, name: str, who: Identity) -> int:
    """As the job's owner: its log, only a plain file of the owner's with one link (the queue
    account made it and gave it to them), opened to append and never through a link."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
    try:
        fd = os.open(name, flags, dir_fd=logs_fd)
    except OSError as e:
        raise OSError(e.errno, f"log logs/{name} cannot be opened by {who.name}: {e.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_uid != os.geteuid():
        os.close(fd)
        raise OSError(errno.EPERM, f"log logs/{name} is not a plain file of {who.name}'s")
    os.set_blocking(fd, True)
    return fd
