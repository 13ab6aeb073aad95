"""The root part's starter: all that a root-run queue does as root besides keeping jobs.

Cron starts `gpuq-worker` as root on every box; that process becomes the *starter* (`serve`).
It starts the worker with the queue account's credentials (the owner of `state/`, as Slurm's
SlurmUser) and answers the orders the worker, its spawner and its supervisors send over the
socket it made for them (host/wire.py says what travels; host/rootorders.py is the queue's
end). Each job runs under a *keeper* (host/keeper.py), forked by the starter once it has
checked the order. Only the starter and the keepers keep root; every function below that runs
as root says so.

Runs as root (docs/security.md, "What runs as root", lists the same):
- serve / _start_worker / _reap: fork the worker; the child drops to the queue account
  (`become`) and execs it.
- _serve_order / _check_order / _member: read one order and check it on its own.
- _give: `fchown` of a plain file the queue account made, to the member it is for (a spec
  it recreated for them, a job's new log), through the descriptor the order carries.
- _place: link a member's spec back into jobs/ between two directories of the queue's.
- _mps (and _root_program, _root_dir, _daemon, _run_root): the NVIDIA MPS control daemon of
  a GPU, which must be root's to serve every member (config gpu_sharing: mps).
- _program (and _run_program): one of the programs gpuq's own extras registered (the notify
  extra's deliverer), started as a member of the queue's group with a fixed argv and a clean
  environment, not waited for (serve's _reap collects it).
- split: root's own `gpuq` on a team root becomes the queue account, keeping a root child
  that answers only `give` and `place`.
Root opens no path of a member's here: what it reads or writes is a descriptor the queue
account opened (the lease, the exit file, the job lock it only holds, the claimed spec it only
fstats), or root's own (MPS's directories, /etc/login.defs).

When the starter is not root (one user's own queue), the same code runs as that user; the
checks that guard a change of identity are then moot, and there is nothing to drop.

This module, host/keeper.py and host/wire.py import only the standard library and each other,
so a reviewer can read the root part whole.
"""

from __future__ import annotations

import errno
import grp
import os
import pwd
import select
import signal
import socket
import stat
import time
from dataclasses import dataclass

from gpuq.host.keeper import PR_SET_PDEATHSIG, start_keeper
from gpuq.host.wire import START_FDS, WORKER_FD_ENV, Identity, Refused, libc, receive, send


@dataclass(frozen=True)
class Account:
    """The queue's account and group: the owner and group of `state/` (or of the root itself
    before the worker made `state/`). A team root's state/ is the queue account's; a root
    nobody made a team root keeps root's own (everything then runs as root, as before)."""

    uid: int
    gid: int

    @classmethod
    def of_root(cls, root: str) -> "Account":
        for path in (os.path.join(root, "state"), root):
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            if not stat.S_ISDIR(st.st_mode):
                raise Refused(f"{path} is not a directory")
            return cls(st.st_uid, st.st_gid)
        raise Refused(f"{root} does not exist")


def serve(
    worker_argv: list[str],
    account: Account,
    worker_env: dict[str, str],
    mps_dir: str | None = None,
    programs: dict[str, list[str]] | None = None,
) -> int:
    """The starter, as root (or as the one user of a private queue): start the worker as the
    queue account, answer its orders until it exits, then exit as it did (killed by a signal:
    killed by the same). Keepers live on in their own sessions; the next cron start begins
    again. `programs`: name -> the argv of a program gpuq's extras registered to run as a
    member (hooks.Registry.member_programs), made by the starter's caller from root's code:
    a `program` order names one, never an argv."""
    os.chdir("/")
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    stopping: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: stopping.append(signum))
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # wakes the select through wake_w
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    worker = _start_worker(worker_argv, account, worker_env, theirs.fileno())
    theirs.close()
    forwarded = False
    listening = True
    while True:
        if stopping and not forwarded:
            os.kill(worker, stopping[0])
            forwarded = True
        try:
            ready, _, _ = select.select([ours.fileno(), wake_r] if listening else [wake_r], [], [], 1.0)
        except InterruptedError:
            ready = []
        if wake_r in ready:
            while True:
                try:
                    if not os.read(wake_r, 512):
                        break
                except BlockingIOError:
                    break
        status = _reap(worker)
        if status is not None:
            if os.WIFSIGNALED(status):  # as the worker was: a crash test, or cron's mail, sees it so
                if os.WTERMSIG(status) not in (signal.SIGKILL, signal.SIGSTOP):
                    signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
                os.kill(os.getpid(), os.WTERMSIG(status))
            return os.waitstatus_to_exitcode(status)
        if listening and ours.fileno() in ready:
            # Once every process of the queue's side has closed its end (the worker as it
            # exits), the end of file stays readable: selecting on it again would spin a core
            # until the worker is reaped. An empty message reads the same, and is no reason to
            # stop answering orders.
            served = _serve_order(ours, account, mps_dir=mps_dir, programs=programs or {})
            listening = served or not _peer_closed(ours)


def _peer_closed(sock: socket.socket) -> bool:
    """Every other end of `sock` is closed (not merely an empty message read)."""
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN | select.POLLRDHUP)
    return any(events & (select.POLLHUP | select.POLLRDHUP) for _, events in poller.poll(0))


def _reap(worker: int) -> int | None:
    """Collect exited children (keepers left over by nothing: they are in their own sessions,
    yet a keeper that failed to start is ours); the worker's wait status once it has exited."""
    found = None
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return found
        if pid == 0:
            return found
        if pid == worker:
            found = status
        for running in _programs.values():
            running.discard(pid)


def _start_worker(argv: list[str], account: Account, env: dict[str, str], order_fd: int) -> int:
    """As root: fork the worker; the child takes the queue account's credentials for good
    (and its group, the queue's), then execs `argv` (the system's interpreter with -I and gpuq's
    own code, both root's: strictmodes checked them) with the order socket at `order_fd`."""
    pid = os.fork()
    if pid:
        return pid
    try:
        os.set_inheritable(order_fd, True)
        become(account)
        libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # the starter killed: so is the worker
        if os.getppid() == 1:
            os._exit(1)
        os.execve(argv[0], argv, {**env, WORKER_FD_ENV: str(order_fd)})
    except BaseException as e:
        os.write(2, f"gpuq: cannot start the worker: {e}\n".encode())
    os._exit(127)


def become(account: Account) -> None:
    """As root: take the queue account's groups, gid and uid for good (real, effective and
    saved). Nothing to do for a process that is not root, or for root's own queue."""
    if os.geteuid() == 0 and account.uid != 0:
        try:
            name = pwd.getpwuid(account.uid).pw_name
        except KeyError:
            raise PermissionError(errno.EPERM, f"the queue's uid {account.uid} has no account on this host") from None
        os.setgroups(os.getgrouplist(name, account.gid))
        os.setgid(account.gid)
        os.setuid(account.uid)


def split(account: Account) -> int | None:
    """As root, in the CLI: become the queue account, keeping a root child that answers only
    `give` and `place` orders (a retried or edited spec is its owner's, a released one goes
    back to jobs/), for as long as this process lives.
    Root's `gpuq` on a team root thus applies a request itself as the workers do: as the queue's
    account, with the root part beside it. Returns this process's end of the root child's
    socket (rootorders.connect takes it); None outside a team root, or not as root."""
    if os.geteuid() != 0 or account.uid == 0:
        return None
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    if os.fork() == 0:
        ours.close()
        os.chdir("/")
        code = 0
        try:
            while _serve_order(theirs, account, ops=("give", "place")):
                pass
        except BaseException:
            code = 1
        os._exit(code)
    theirs.close()
    become(account)
    return ours.detach()


# The starter's answers never wait: the reply socket is the queue side's, which could leave its
# other end full and open, and a blocked starter answers nothing and reaps no one.
NOWAIT = socket.MSG_DONTWAIT


def _serve_order(
    sock: socket.socket,
    account: Account,
    ops: tuple[str, ...] = ("give", "place", "start", "mps", "program"),
    mps_dir: str | None = None,
    programs: dict[str, list[str]] | None = None,
) -> bool:
    """As root: one order from the queue's side, checked on its own, answered on the reply
    socket it carries (the first descriptor). Nothing an order says is trusted beyond it.
    False once the queue's side has closed the socket."""
    try:
        order, fds = receive(sock)
    except (OSError, Refused):
        return True
    if order is None or not fds:
        for fd in fds:
            os.close(fd)
        return order is not None
    try:  # the reply descriptor is the queue side's: a socket of its choosing, or no socket
        if not stat.S_ISSOCK(os.fstat(fds[0]).st_mode):
            raise OSError(errno.ENOTSOCK, "the reply descriptor is no socket")
        reply = socket.socket(fileno=fds[0])
    except OSError:
        for fd in fds:
            os.close(fd)
        return True
    try:
        op = order.get("op")
        if op not in ops:
            raise Refused(f"unknown order {op!r}")
        if op == "give" and len(fds) == 2:
            _give(fds[1], order.get("uid"), account)
            send(reply, {"given": True}, [], NOWAIT)
        elif op == "place" and len(fds) == 3:
            _place(fds[1], order.get("name"), fds[2], order.get("as"), account)
            send(reply, {"placed": True}, [], NOWAIT)
        elif op == "start":
            checked = _check_order(order, fds[1:], account)
            start_keeper(reply, checked, dict(zip(order["fds"], fds[1:])))
        elif op == "mps" and mps_dir is not None:
            send(reply, _mps(order, mps_dir), [], NOWAIT)
        elif op == "program" and programs:
            pid, out = _program(order, account, programs)
            try:
                send(reply, {"started": pid, "fds": ["out"]}, [out], NOWAIT)
            finally:
                os.close(out)
        else:
            raise Refused(f"unknown order {op!r}")
    except Refused as e:
        try:
            send(reply, {"error": str(e)}, [], NOWAIT)
        except OSError:
            pass
    except OSError as e:
        try:
            send(reply, {"error": f"{e.strerror or e}"}, [], NOWAIT)
        except OSError:
            pass
    finally:
        reply.close()
        for fd in fds[1:]:
            os.close(fd)
    return True


NOBODY = ("nobody", "nfsnobody")


def regular_uid(uid: int) -> bool:
    """Whether `uid` is a person's account: not a system account (below login.defs' UID_MIN,
    1000 by default), not `nobody` (what root squash maps an NFS client's root to, and what an
    unmapped uid shows as). A team queue runs jobs only for those."""
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        return False
    return uid >= _uid_min() and name not in NOBODY and uid not in (65534, 4294967294)


def _uid_min() -> int:
    try:
        with open("/etc/login.defs", "rb") as f:  # root's: the system's account policy
            for line in f.read(1 << 16).splitlines():
                words = line.split()
                if len(words) == 2 and words[0] == b"UID_MIN" and words[1].isdigit():
                    return int(words[1])
    except OSError:
        pass
    return 1000


def _member(uid: object, account: Account) -> Identity:
    """As root: whom a job or a file may be for. A root starter serving a queue account runs
    jobs only as members of the queue's group: never as root, never as the queue account
    itself (whose files the worker trusts). A starter that is not root runs only as itself."""
    if type(uid) is not int or uid < 0:
        raise Refused(f"not a uid: {uid!r}")
    euid = os.geteuid()
    if euid != 0 and uid != euid:
        raise Refused(f"this starter runs as uid {euid} and cannot run anything as uid {uid}")
    try:
        pw = pwd.getpwuid(uid)
    except KeyError:
        raise Refused(f"uid {uid} has no account on this host") from None
    groups = tuple(os.getgrouplist(pw.pw_name, pw.pw_gid))
    if euid == 0 and account.uid != 0:
        if uid == 0:
            raise Refused("a team queue never runs anything as root")
        if uid == account.uid:
            raise Refused("the queue's own account runs no jobs")
        if account.gid not in groups:
            raise Refused(f"{pw.pw_name} is not in the queue's group ({_group_name(account.gid)})")
        if not regular_uid(uid):
            raise Refused(f"{pw.pw_name} (uid {uid}) is a system account or nobody, not a member's")
    return Identity(uid, pw.pw_gid, groups, pw.pw_name)


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return f"gid {gid}"


def _give(fd: int, uid: object, account: Account) -> None:
    """As root: `fchown` the file open on `fd` to `uid`, keeping its group. Only a plain file
    of the queue account's, with one link and no set-id bit, and only to a member."""
    who = _member(uid, account)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_mode & (stat.S_ISUID | stat.S_ISGID):
        raise Refused("only a plain file with one link is given")
    if st.st_uid != account.uid:
        raise Refused("only a file of the queue's account is given")
    if os.geteuid() == 0:
        os.fchown(fd, who.uid, -1)
    elif who.uid != st.st_uid:
        raise Refused("only root gives files away")


def _place(src_dir: int, name: object, dst_dir: int, dest: object, account: Account) -> None:
    """As root: link a member's file, which the queue account holds in a directory of its own,
    back into a directory of the queue account's (a requeued or released spec to jobs/),
    never over a file already there: the kernel (protected_hardlinks) lets only the file's
    owner, or root, link it. Both directories are descriptors the queue account opened; no
    link is followed."""
    for value in (name, dest):
        if not _plain(value) or "/" in str(value) or value in ("", ".", "..") or len(str(value)) > 255:
            raise Refused(f"not a file name: {value!r}")
    for fd, what in ((src_dir, "from"), (dst_dir, "into")):
        st = os.fstat(fd)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != account.uid:
            raise Refused(f"a file is placed {what} a directory of the queue's account only")
    if os.fstat(src_dir).st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise Refused("a file is placed from a directory only the queue's account writes")
    st = os.stat(str(name), dir_fd=src_dir, follow_symlinks=False)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        raise Refused("only a plain file with one link is placed")
    _member(st.st_uid, account)
    try:
        os.link(str(name), str(dest), src_dir_fd=src_dir, dst_dir_fd=dst_dir, follow_symlinks=False)
    except FileExistsError:
        raise Refused("exists") from None


MPS_CONTROL = "nvidia-cuda-mps-control"
MPS_WAIT_S = 5.0


def _mps(order: dict, base: str) -> dict:
    """As root: start or quit the NVIDIA MPS control daemon of one GPU (config gpu_sharing:
    mps). It must be root's to start MPS servers for each member (a daemon of the queue
    account's serves only that account). Its program is the one on the starter's own PATH (cron's,
    root's), root's and nobody else's to change; its directories, `base/<GPU>/{pipe,log}`, are
    root's, made here; its environment is fixed. Nothing of a member's is touched."""
    index, uuid, action = order.get("index"), order.get("uuid", ""), order.get("action")
    if type(index) is not int or not 0 <= index < 1024:
        raise Refused("index must be a GPU index")
    if not isinstance(uuid, str) or len(uuid) > 80 or not all(c.isalnum() or c == "-" for c in uuid):
        raise Refused("uuid must be a GPU's UUID")
    program = _root_program(MPS_CONTROL)
    pipe, logs = os.path.join(base, str(index), "pipe"), os.path.join(base, str(index), "log")
    for d in (base, os.path.join(base, str(index)), pipe, logs):
        _root_dir(d)
    env = {"PATH": "/usr/bin:/bin", "CUDA_MPS_PIPE_DIRECTORY": pipe, "CUDA_MPS_LOG_DIRECTORY": logs}
    pid_file = os.path.join(pipe, "nvidia-cuda-mps-control.pid")
    if action == "start":
        if _daemon(pid_file) is None:
            for name in os.listdir(pipe):  # a crashed daemon's sockets (root's, in root's directory)
                os.unlink(os.path.join(pipe, name))
            _run_root(program, ["-d"], {**env, "CUDA_VISIBLE_DEVICES": uuid}, None)
            deadline = time.monotonic() + MPS_WAIT_S
            while _daemon(pid_file) is None:
                if time.monotonic() > deadline:
                    raise Refused(f"{MPS_CONTROL} -d wrote no pid file in {pipe} within {MPS_WAIT_S:g} s")
                time.sleep(0.02)
        return {"pipe": pipe}
    if action == "quit":
        if (pid := _daemon(pid_file)) is not None:
            _run_root(program, [], env, b"quit\n")
            deadline = time.monotonic() + MPS_WAIT_S
            while _daemon(pid_file) == pid and time.monotonic() < deadline:
                time.sleep(0.02)
            if _daemon(pid_file) == pid:
                os.kill(pid, signal.SIGKILL)
        for name in os.listdir(pipe):
            os.unlink(os.path.join(pipe, name))
        return {"pipe": pipe}
    raise Refused(f"unknown MPS action {action!r}")


def _root_program(name: str) -> str:
    """As root: `name` on the starter's own PATH, only where it and its directory are root's
    and nobody else may change them."""
    for d in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep):
        path = os.path.join(d, name)
        try:
            st, dst = os.stat(path), os.stat(d)
        except OSError:
            continue
        if any(s.st_uid != 0 or s.st_mode & 0o022 for s in (st, dst)) or not st.st_mode & 0o111:
            raise Refused(f"{path} is not root's alone: root does not run it")
        return path
    raise Refused(f"{name} is not on the worker's PATH (it comes with the NVIDIA driver's compute utilities)")


def _root_dir(path: str) -> None:
    """As root: `path` a directory of root's that others may enter but not change (0755),
    made where missing; anything else there is refused, never used."""
    try:
        os.mkdir(path, 0o755)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
        raise Refused(f"{path} is not a directory of root's that only root changes: remove it")


def _daemon(pid_file: str) -> int | None:
    """The control daemon's pid, where its pid file (root's) names a live process of root's."""
    try:
        with open(pid_file, "rb") as f:
            text = f.read(32).strip()
        pid = int(text)
        if os.stat(f"/proc/{pid}").st_uid != 0:
            return None
        with open(f"/proc/{pid}/stat", "rb") as f:
            return None if f.read().rsplit(b")", 1)[1].split()[0] == b"Z" else pid
    except (OSError, ValueError, IndexError):
        return None


def _run_root(program: str, args: list[str], env: dict[str, str], stdin: bytes | None) -> None:
    """As root: run the MPS control program, at most MPS_WAIT_S, from `/`, nothing inherited."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.chdir("/")
            os.setsid()
            os.dup2(r, 0)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            os.closerange(3, 65536)
            os.execve(program, [program, *args], env)
        finally:
            os._exit(127)
    os.close(r)
    if stdin:
        os.write(w, stdin)
    os.close(w)
    deadline = time.monotonic() + MPS_WAIT_S
    while time.monotonic() < deadline:
        if os.waitpid(pid, os.WNOHANG)[0]:
            return
        time.sleep(0.02)
    os.killpg(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise Refused(f"{MPS_CONTROL} did not return within {MPS_WAIT_S:g} s")


MAX_PROGRAM_INPUT = 1 << 16  # a program's stdin: one event of one job (notify's is under 4 KiB)
# Programs running as one member at once: the queue's account may start them (a compromised
# one could forge an event and have a member's own notify command run with its text), never
# flood a member with them.
MAX_PROGRAMS_PER_MEMBER = 8
_programs: dict[int, set[int]] = {}  # uid -> pids of its programs not yet reaped (_reap)
PROGRAM_PATH = "/usr/local/bin:/usr/bin:/bin"


def _program(order: dict, account: Account, programs: dict[str, list[str]]) -> tuple[int, int]:
    """As root: start the registered program `order["name"]` as the member `order["uid"]`
    (_member: as for a job, never root nor the queue account), its stdin `order["stdin"]`;
    not waited for (serve's _reap collects it). Returns its pid and the read end of its
    stdout and stderr, for the queue's side to read. The argv is the starter's own, from
    `programs`: the order only names it."""
    name, text = order.get("name"), order.get("stdin")
    if not isinstance(name, str) or name not in programs:
        raise Refused(f"no program {name!r} is registered to run as a member")
    if not _plain(text) or len(str(text)) > MAX_PROGRAM_INPUT:
        raise Refused(f"stdin must be text of at most {MAX_PROGRAM_INPUT} characters")
    who = _member(order.get("uid"), account)
    if len(_programs.setdefault(who.uid, set())) >= MAX_PROGRAMS_PER_MEMBER:
        raise Refused(f"{MAX_PROGRAMS_PER_MEMBER} programs run as {who.name} already: try later")
    try:
        home = pwd.getpwuid(who.uid).pw_dir
    except KeyError:
        raise Refused(f"uid {who.uid} has no account on this host") from None
    if who.uid == os.geteuid():  # no change of identity (one user's queue): that user's own HOME
        home = os.environ.get("HOME") or home
    env = {"HOME": home, "USER": who.name, "LOGNAME": who.name, "PATH": PROGRAM_PATH, "LANG": "C.UTF-8"}
    stdin = os.memfd_create("gpuq-program-stdin")
    try:
        os.write(stdin, str(text).encode())
        os.lseek(stdin, 0, os.SEEK_SET)
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        pid = os.fork()
        if pid == 0:
            _run_program(who, programs[name], env, stdin, write_end)
    finally:
        os.close(stdin)
    os.close(write_end)
    _programs[who.uid].add(pid)
    return pid, read_end


def _run_program(who: Identity, argv: list[str], env: dict[str, str], stdin: int, out: int) -> None:
    """In the program's process, forked by the starter (root): its own session, then the
    member's groups, gid and uid for good, as a job's process drops (keeper._job), before it
    executes anything; only stdin, stdout and stderr kept."""
    try:
        os.setsid()
        if os.geteuid() == 0 and who.uid != 0:
            os.setgroups(list(who.groups))
            os.setgid(who.gid)
            os.setuid(who.uid)
        os.chdir("/")
        os.dup2(stdin, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.closerange(3, 65536)
        signal.set_wakeup_fd(-1)
        for sig in signal.valid_signals():
            if sig not in (signal.SIGKILL, signal.SIGSTOP) and sig < signal.SIGRTMIN:
                signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        os.execve(argv[0], argv, env)
    except BaseException as e:
        try:
            os.write(2, f"gpuq: cannot start {argv[-1]} as {who.name}: {e}\n".encode())
        except OSError:
            pass
    os._exit(127)


def _check_order(order: dict, fds: list[int], account: Account) -> dict:
    """As root: a start order, checked field by field; its owner a member (_member) who owns
    the claimed spec it hands over as a descriptor."""
    names = order.get("fds")
    if not isinstance(names, list) or len(names) != len(fds) or not set(names) <= set(START_FDS):
        raise Refused("the order's descriptors are not named")
    who = _member(order.get("uid"), account)
    by_name = dict(zip(names, fds))
    if os.geteuid() == 0 and account.uid != 0:
        if "spec" not in by_name:
            raise Refused("a start shows the claimed spec")
        st = os.fstat(by_name["spec"])
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_uid != who.uid:
            raise Refused(f"the claimed spec is not a plain file of {who.name}'s")
    argv, env, cwd = order.get("argv"), order.get("env"), order.get("cwd")
    if not isinstance(argv, list) or not argv or not all(_plain(a) for a in argv):
        raise Refused("argv must be a non-empty list of strings")
    if not isinstance(env, dict) or not all(_plain(k) and "=" not in k and k and _plain(v) for k, v in env.items()):
        raise Refused("env must map names to strings")
    if not _plain(cwd) or not str(cwd).startswith("/"):
        raise Refused("cwd must be an absolute path")
    cores = order.get("cores") or []
    if not isinstance(cores, list) or not all(type(c) is int and 0 <= c < 65536 for c in cores):
        raise Refused("cores must be CPU indices")
    log = order.get("log")
    if log is not None and (not _plain(log) or "/" in log or log.startswith(".") or "logs" not in by_name):
        raise Refused("log must be a file name in the logs directory handed over")
    for key in ("grace_s", "fence_after_s"):
        if order.get(key) is not None and not isinstance(order[key], (int, float)):
            raise Refused(f"{key} must be a number")
    if order.get("stdin") is not None and not _plain(order["stdin"]):
        raise Refused("stdin must be text")
    return {
        "who": who,
        "argv": argv,
        "env": env,
        "cwd": cwd,
        "cores": cores,
        "log": log,
        "header": str(order.get("header") or ""),
        "grace_s": float(order.get("grace_s") or 10.0),
        "fence_after_s": order.get("fence_after_s"),
        "stdin": order.get("stdin"),
        "capture": order.get("capture") is True,
    }


def _plain(value: object) -> bool:
    return isinstance(value, str) and "\0" not in value
