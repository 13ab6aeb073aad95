"""The queue's end of the root part (host/privsep.py): the orders the worker, its spawner and
its supervisors send to their box's starter, as the queue's account. `orders()` is this
process's socket to it (inherited from the worker); `start` runs a job (or a command of a
job's) as its owner under a keeper, `give` hands a file the queue account made to a member,
`place` links a member's spec back into jobs/, `mps` starts or quits an MPS control daemon,
`program` runs a program gpuq's extras registered (hooks.Registry.member_programs: the
notify extra's deliverer) as a member, without waiting for it.
"""

from __future__ import annotations

import errno
import os
import select
import signal
import socket
import sys
import time
from dataclasses import dataclass

from gpuq.host.wire import MAX_OUTPUT, START_FDS, WORKER_FD_ENV, Refused, StarterGone, receive, send


class Orders:
    """The queue's end of the starter's socket (in the worker, its spawner and supervisors):
    `start` a job under a keeper, `give` a file to a member. Each order carries its own reply
    socket, so that any number of processes may share the one order socket."""

    def __init__(self, fd: int) -> None:
        self.sock = socket.socket(fileno=fd)
        # As whom jobs run: as their owners when the starter is root, else as the starter.
        self.starter_uid = _peer_uid(self.sock)

    def fileno(self) -> int:
        return self.sock.fileno()

    def _ask(self, order: dict, fds: list[int], timeout: float | None) -> tuple[socket.socket, dict, list[int]]:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            send(self.sock, order, [theirs.fileno(), *fds])
        except OSError as e:
            mine.close()
            raise StarterGone(f"the box's starter is gone ({e.strerror or e})") from None
        finally:
            theirs.close()
        mine.settimeout(timeout)
        try:
            answer, got = receive(mine)
        except (OSError, Refused):
            mine.close()
            raise
        if answer is None:
            mine.close()
            raise StarterGone("the box's starter closed the order without an answer")
        if "error" in answer:
            mine.close()
            handed = _handed(answer, got)
            for name, fd in handed.items():
                if name != "log":
                    os.close(fd)
            raise Refused(str(answer["error"]), handed.get("log"))
        return mine, answer, got

    def give(self, fd: int, uid: int) -> None:
        """Make the file open on `fd` (the queue account's) `uid`'s. Raises Refused."""
        mine, _, got = self._ask({"op": "give", "uid": uid}, [fd], timeout=30.0)
        mine.close()
        for extra in got:
            os.close(extra)

    def place(self, src_dir: int, name: str, dst_dir: int, dest: str) -> None:
        """Link the member's file `name` (in `src_dir`) as `dest` in `dst_dir`. Raises Refused
        ("exists" when `dest` is taken)."""
        mine, _, got = self._ask({"op": "place", "name": name, "as": dest}, [src_dir, dst_dir], timeout=30.0)
        mine.close()
        for extra in got:
            os.close(extra)

    def mps(self, action: str, index: int, uuid: str = "") -> str:
        """Start (or quit) the MPS control daemon of GPU `index` as root: its pipe directory.
        Raises Refused with why."""
        mine, answer, got = self._ask({"op": "mps", "action": action, "index": index, "uuid": uuid}, [], 30.0)
        mine.close()
        for extra in got:
            os.close(extra)
        return str(answer.get("pipe", ""))

    def program(self, name: str, uid: int, stdin: str) -> tuple[int, int]:
        """Start the registered program `name` as `uid` with `stdin`: (its pid, the read end
        of its output, for the caller to read and close). Nobody here waits for it: the
        starter reaps it. Raises Refused, StarterGone."""
        mine, answer, got = self._ask({"op": "program", "name": name, "uid": uid, "stdin": stdin}, [], 30.0)
        mine.close()
        out = _handed(answer, got).get("out")
        if out is None:
            raise Refused("the starter handed over no output of the program")
        return int(answer["started"]), out

    def start(self, order: dict, fds: dict[str, int]) -> "Keeper":
        """Start one job (or a helper command of one) under a keeper. `order`: uid, argv, env,
        cwd, cores, log (its name under the logs directory, or None), header (the first lines
        of this run in the log), grace_s, fence_after_s. `fds`: any of START_FDS. Raises
        Refused when the starter refuses it or the job could not start (the reason says which)."""
        names = [name for name in START_FDS if name in fds]
        mine, answer, got = self._ask({"op": "start", **order, "fds": names}, [fds[n] for n in names], timeout=60.0)
        mine.settimeout(None)
        handed = _handed(answer, got)
        return Keeper(mine, int(answer["started"]), int(answer["keeper"]), handed.get("log"), handed.get("out"))

    def run(
        self,
        uid: int,
        argv: list[str],
        env: dict[str, str],
        spec_fd: int | None,
        stdin: str | None = None,
        timeout: float = 30.0,
    ) -> tuple[int | None, str]:
        """Run a helper command for a job as its owner (a container client's stop or removal,
        sbatch): (its wait status, or None when it ran past `timeout` and was killed; what it
        printed, at most MAX_OUTPUT bytes). `spec_fd`: the job's claimed spec, which the root
        part checks as for the job itself. Raises Refused, StarterGone."""
        order = {"uid": uid, "argv": argv, "env": env, "cwd": "/", "stdin": stdin, "capture": True}
        keeper = self.start(order, {"spec": spec_fd} if spec_fd is not None else {})
        deadline = time.monotonic() + timeout
        out = bytearray()
        try:
            while keeper.out_fd is not None and (left := deadline - time.monotonic()) > 0:
                ready, _, _ = select.select([keeper.out_fd], [], [], left)
                chunk = os.read(keeper.out_fd, 65536) if ready else b""
                if not chunk:
                    break
                out += chunk[: MAX_OUTPUT - len(out)]
            ended = keeper.ended(max(0.0, deadline - time.monotonic()))
            if ended is None:
                keeper.signal(signal.SIGKILL)
                keeper.ended(10.0)
                return None, out.decode(errors="replace")
            return int(ended["status"]), out.decode(errors="replace")
        finally:
            keeper.close()


_orders: list[Orders] = []


def give(fd: int, uid: int, gid: int = -1) -> None:
    """Make the file open on `fd` `uid`'s: a spec the queue's account wrote on a member's
    behalf. Root does it itself (root's own queue); the queue's account asks the root part;
    a file already `uid`'s needs nothing. Raises PermissionError when no one here may."""
    if os.geteuid() == 0:
        os.fchown(fd, uid, gid)
    elif uid != os.fstat(fd).st_uid:
        connection = orders()
        if connection is None:
            raise PermissionError(errno.EPERM, f"only the root part can give a file to uid {uid}, and none is here")
        try:
            connection.give(fd, uid)
        except (Refused, StarterGone) as e:
            raise PermissionError(errno.EPERM, f"the root part did not give a file to uid {uid}: {e}") from None


def place(source: str, dest: str) -> bool:
    """Link a member's file `source` to `dest` (never over a file there) through the root part:
    only a file's owner, or root, may link it. False when `dest` exists. Raises
    PermissionError when no root part is here, or it refuses."""
    connection = orders()
    if connection is None:
        raise PermissionError(errno.EPERM, "only the root part can link another user's file, and none is here", source)
    src_dir = os.open(os.path.dirname(source), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        dst_dir = os.open(os.path.dirname(dest), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            connection.place(src_dir, os.path.basename(source), dst_dir, os.path.basename(dest))
        finally:
            os.close(dst_dir)
    except Refused as e:
        if str(e) == "exists":
            return False
        raise PermissionError(errno.EPERM, f"the root part did not link it: {e}", source) from None
    except StarterGone as e:
        raise PermissionError(errno.EPERM, str(e), source) from None
    finally:
        os.close(src_dir)
    return True


def connect(fd: int) -> None:
    """Send this process's orders on `fd` from now on (root's CLI, once privsep.split made it)."""
    _orders[:] = [Orders(fd)]


def disconnect() -> None:
    """Give up this process's root part (root's CLI, after privsep.split): its root child,
    whose socket this was, exits. For a verb that lives long and needs no root (`gpuq serve`)."""
    for connection in _orders:
        connection.sock.close()
    _orders.clear()


def orders() -> Orders | None:
    """This process's end of its starter's socket: the worker has it from the starter, and its
    spawner and supervisors inherit it. None elsewhere (the CLI, a test driving a worker pass)."""
    if not _orders:
        fd = os.environ.get(WORKER_FD_ENV, "")
        if not fd.isdigit():
            return None
        try:
            os.set_inheritable(int(fd), False)  # no helper the worker runs gets it; the spawner is handed it
            _orders.append(Orders(int(fd)))
        except OSError:
            return None
    return _orders[0]


def root_started() -> bool:
    """Whether this process works for root: it is root, or its orders go to a root part that
    is (a team's worker, its spawner and supervisors, root's gpuq acting as the queue's
    account). Such a box keeps its worker's local directory where only root makes one
    (single_instance.default_local_dir), whoever asks."""
    return os.geteuid() == 0 or ((connection := orders()) is not None and connection.starter_uid == 0)


def _handed(answer: dict, fds: list[int]) -> dict[str, int]:
    """The descriptors a keeper's answer carries, by the names it gives them ("log", "out")."""
    names = answer.get("fds")
    if not isinstance(names, list) or len(names) != len(fds):
        for fd in fds:
            os.close(fd)
        return {}
    return dict(zip(map(str, names), fds))


def _peer_uid(sock: socket.socket) -> int:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    return int.from_bytes(creds[4:8], sys.byteorder)


@dataclass
class Keeper:
    """The queue's handle of one job's keeper: the job's pid, the keeper's (the root of the
    job's process tree), and the job's log as the job opened it (for gpuq's own lines)."""

    sock: socket.socket
    pid: int
    keeper_pid: int
    log_fd: int | None
    out_fd: int | None = None  # a helper's output (Orders.run)

    def signal(self, sig: int) -> None:
        try:
            send(self.sock, {"signal": int(sig)}, [])
        except OSError:
            pass  # the keeper is gone: the job has ended

    def ended(self, timeout: float | None) -> dict | None:
        """Once the job and its leftovers are gone: {"status": its wait status, "fenced": whether
        the keeper stopped it for an old lease, "cpu_s": the CPU time of its whole tree}; None
        while it runs. A keeper gone without a word counts as a job killed (SIGKILL)."""
        ready, _, _ = select.select([self.sock], [], [], timeout)
        if not ready:
            return None
        try:
            message, fds = receive(self.sock)
        except (OSError, Refused):
            message, fds = None, []
        for fd in fds:
            os.close(fd)
        if message is None:
            return {"status": signal.SIGKILL, "fenced": False, "cpu_s": None}
        return message if type(message.get("status")) is int else None

    def close(self) -> None:
        self.sock.close()
        for fd in (self.log_fd, self.out_fd):
            if fd is not None:
                os.close(fd)
        self.log_fd = self.out_fd = None
