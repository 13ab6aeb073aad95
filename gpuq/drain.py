"""Draining a box: `gpuq drain HOST` leaves state/drain/<host>.json; that host's worker then
claims nothing new while its running jobs finish, and `gpuq status` shows it draining (jobs
still running) or drained. `gpuq resume HOST` removes the file."""
from __future__ import annotations

import getpass
from pathlib import Path
from typing import Any

from .faults import wall_time
from .layout import Layout
from .spool import read_json, write_json


def drain_file(layout: Layout, host: str) -> Path:
    return layout.drains / f"{host}.json"


def drain(layout: Layout, host: str, reason: str | None) -> None:
    path = drain_file(layout, host)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, {"host": host, "by": getpass.getuser(), "at": wall_time(), "reason": reason})


def resume(layout: Layout, host: str) -> bool:
    """False: it was not drained."""
    try:
        drain_file(layout, host).unlink()
    except FileNotFoundError:
        return False
    return True


def drained(layout: Layout, host: str) -> dict[str, Any] | None:
    """{host, by, at, reason} while the host is drained, else None."""
    try:
        return read_json(drain_file(layout, host))
    except ValueError:  # a torn file from an older writer: still drained
        return {"host": host, "by": None, "at": None, "reason": None}
