"""What travels between `gpuq run` (the member's terminal) and its job's end of the session
(attach.py, the job itself, run as the same member on the same box) over the Unix socket the
CLI listens on: frames of (channel, length, bytes). Control frames hold one JSON object.

- CLI -> job: HELLO {env, cwd, tty, rows, cols, shell}, then IN (stdin bytes), WINSIZE {rows,
  cols}, EOF {} (stdin closed).
- job -> CLI: READY {job, host, gpus} as it connects, OUT and ERR (bytes), NOTE {text} (a line
  for the terminal: released when idle, stopped), EXIT {code, signal}.
"""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

HELLO, IN, WINSIZE, EOF, READY, OUT, ERR, NOTE, EXIT = range(9)
CONTROL = frozenset({HELLO, WINSIZE, EOF, READY, NOTE, EXIT})
HEADER = struct.Struct(">BI")
MAX_FRAME = 1 << 20  # a control object or a chunk of output: never more at once
CHUNK = 65536


class WireError(Exception):
    """The other end broke the protocol, or went away mid-frame."""


def send(sock: socket.socket, channel: int, data: bytes) -> None:
    sock.sendall(HEADER.pack(channel, len(data)) + data)


def send_json(sock: socket.socket, channel: int, obj: dict[str, Any]) -> None:
    send(sock, channel, json.dumps(obj).encode())


class Reader:
    """Frames from a socket, as its bytes arrive (the caller selects on it first)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buffer, self.closed = sock, b"", False

    def read(self) -> list[tuple[int, bytes]]:
        """The whole frames the socket holds now (at most one recv); `closed` once it ends."""
        got = self.sock.recv(CHUNK + HEADER.size)
        if not got:
            self.closed = True
            if self.buffer:
                raise WireError("the session ended mid-frame")
        self.buffer += got
        frames = []
        while len(self.buffer) >= HEADER.size:
            channel, length = HEADER.unpack_from(self.buffer)
            if length > MAX_FRAME or channel > EXIT:
                raise WireError(f"a frame of channel {channel} and {length} bytes")
            if len(self.buffer) < HEADER.size + length:
                break
            frames.append((channel, self.buffer[HEADER.size : HEADER.size + length]))
            self.buffer = self.buffer[HEADER.size + length :]
        return frames


def control(data: bytes) -> dict[str, Any]:
    """A control frame's object; WireError for anything else."""
    try:
        found = json.loads(data)
    except ValueError:
        found = None
    if not isinstance(found, dict):
        raise WireError("a control frame that is not a JSON object")
    return found


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end (the kernel's word, SO_PEERCRED)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]
