"""Draining a box: `gpuq drain HOST` leaves state/drain/<host>.json; that host's worker then
claims nothing new while its running jobs finish, and `gpuq status` shows it draining (jobs
still running) or drained. `gpuq resume HOST` removes the file. Both are admins' (as in Slurm):
a worker applies them from a request whose owner is root, the worker's account or in `admins`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gpuq.host.faults import wall_time
from gpuq.host.files import read_json, write_json
from gpuq.host.owners import Actor
from gpuq.model.names import HOST_RE
from gpuq.spool.layout import Layout


def drain_file(layout: Layout, host: str) -> Path:
    return layout.drains / f"{host}.json"


def drain(layout: Layout, host: str, reason: str | None, actor: Actor) -> str:
    check_admin(host, actor, "drain")
    if not layout.heartbeat(host).exists():
        raise DrainError(f"no host named {host!r} has run a worker here")
    write_json(
        drain_file(layout, host),
        {"host": host, "by": actor.name, "at": wall_time(), "reason": reason if isinstance(reason, str) else None},
    )
    return f"{host}: draining; running jobs finish, nothing new starts there (gpuq resume {host})"


def resume(layout: Layout, host: str, actor: Actor) -> str:
    check_admin(host, actor, "resume")
    try:
        drain_file(layout, host).unlink()
    except FileNotFoundError:
        raise DrainError(f"{host} is not drained") from None
    return f"{host}: resumed; its worker claims jobs again"


class DrainError(Exception):
    pass


def check_admin(host: str, actor: Actor, verb: str) -> None:
    if not isinstance(host, str) or not HOST_RE.match(host):
        raise DrainError(f"{str(host)[:80]!r} is not a host name")
    if not actor.admin:
        raise DrainError(f"only root or an admin (config `admins`) may {verb} a host; {actor.name} is not one")


def drained_hosts(layout: Layout) -> dict[str, dict[str, Any]]:
    """Every drained host's order: one listing of a small directory, not a look per host."""
    try:
        names = os.listdir(layout.drains)
    except OSError:
        return {}
    out = {}
    for name in names:
        host = name[: -len(".json")] if name.endswith(".json") else None
        if host and HOST_RE.match(host) and (order := drained(layout, host)) is not None:
            out[host] = order
    return out


def drained(layout: Layout, host: str) -> dict[str, Any] | None:
    """{host, by, at, reason} while the host is drained, else None."""
    try:
        data = read_json(drain_file(layout, host))
        return (
            data if data is None or isinstance(data, dict) else {"host": host, "by": None, "at": None, "reason": None}
        )
    except ValueError:  # a torn file from an older writer: still drained
        return {"host": host, "by": None, "at": None, "reason": None}
