"""What travels between the queue's account and the root part (host/privsep.py,
host/keeper.py): messages, one JSON object each, on SOCK_SEQPACKET sockets, with the
descriptors they hand over (SCM_RIGHTS); the refusals; and the lease's format, which the worker
writes and a keeper reads. Imported by both sides, it imports only the standard library.
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import time
from dataclasses import dataclass
from typing import Any

MAX_ORDER = 1 << 20  # a start carries the job's env and argv: a spec is at most 256 KiB
MAX_FDS = 8
MAX_OUTPUT = 1 << 20  # what a helper prints (a container's pid, sbatch's job id) is a line
START_FDS = ("spec", "lock", "lease", "exit", "logs")  # what a start may hand over, by name
WORKER_FD_ENV = "GPUQ_STARTER_FD"  # the worker's end of the order socket, in its environment


class StarterGone(Exception):
    """The starter's socket is closed: the box's worker and starter are gone (a new one starts
    at the next cron minute). Nothing was started."""


class Refused(Exception):
    """An order the root part will not carry out, or a job that could not start; the message
    says why. `log_fd`: the job's log, where it could open it before it failed."""

    def __init__(self, message: str, log_fd: int | None = None) -> None:
        super().__init__(message)
        self.log_fd = log_fd


@dataclass(frozen=True)
class Identity:
    """Whom the root part runs a job as, as it checked them (privsep._member)."""

    uid: int
    gid: int
    groups: tuple[int, ...]
    name: str


def libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def send(sock: socket.socket, message: dict, fds: list[int], flags: int = 0) -> None:
    data = json.dumps(message).encode()
    if len(data) > MAX_ORDER:
        raise Refused(f"order of {len(data)} bytes, over {MAX_ORDER}")
    socket.send_fds(sock, [data], fds, flags) if fds else sock.send(data, flags)


def receive(sock: socket.socket) -> tuple[dict | None, list[int]]:
    """One message and the descriptors it carried; (None, []) at EOF. A message that is not a
    JSON object is an error (its descriptors closed)."""
    data, fds, flags, _ = socket.recv_fds(sock, MAX_ORDER, MAX_FDS)
    if not data:
        for fd in fds:
            os.close(fd)
        return None, []
    try:
        message = json.loads(data)
        if not isinstance(message, dict) or flags & socket.MSG_CTRUNC or flags & socket.MSG_TRUNC:
            raise ValueError("not an order")
    except ValueError:
        for fd in fds:
            os.close(fd)
        raise Refused("a message that is not an order") from None
    return message, fds


def lease_age(fd: int) -> float | None:
    """Seconds since the lease on `fd` was renewed; None if it was never written (or cannot be
    read: a lease nobody can read fences nothing, the supervisor's own check still does)."""
    try:
        return time.monotonic() - float(os.pread(fd, 64, 0))
    except (OSError, ValueError):
        return None


def write_lease(fd: int, now_mono: float) -> None:
    """The box's lease, rewritten in place (the keepers hold descriptors on this very file):
    when the worker last wrote its heartbeat, on the host's monotonic clock."""
    os.pwrite(fd, f"{now_mono:32.6f}\n".encode(), 0)
