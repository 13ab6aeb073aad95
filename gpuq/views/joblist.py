"""`gpuq status --format id,user,state,reason`: the jobs of the status view as one table of
the columns asked, as squeue's -o gives them: running, then pending in queue order, then held
and the finished ones the view holds. No hosts, no sections: a line per job, for eyes and grep."""

from __future__ import annotations

from typing import Any, Callable

from gpuq.model.units import format_duration, format_mib
from gpuq.views.render import safe_tree, start_by, table, where

Row = dict[str, Any]


def _gpus(r: Row) -> str:
    gpus = r.get("gpus")
    return str(len(gpus) if isinstance(gpus, list) else gpus if gpus is not None else "-")


def _gpu_mem(r: Row) -> str:
    mib = r.get("gpu_mem_mib", r.get("declared_gpu_mem_mib"))
    return format_mib(mib) if mib else "-"


def _time(r: Row) -> str:
    return format_duration(r.get("elapsed_s", r.get("waiting_s", r.get("duration_s"))))


# Each column: its heading and how a row of any section shows in it.
COLUMNS: dict[str, tuple[str, Callable[[Row, float], str]]] = {
    "position": ("#", lambda r, now: str(r.get("position") or "-")),
    "id": ("ID", lambda r, now: r["id"]),
    "user": ("USER", lambda r, now: r.get("user") or "?"),
    "state": ("STATE", lambda r, now: r["state"]),
    "gpus": ("GPUS", lambda r, now: _gpus(r)),
    "gpu_mem": ("GPU MEM", lambda r, now: _gpu_mem(r)),
    "where": ("WHERE", lambda r, now: where(r.get("host"), r.get("gpus"))),
    "time": ("TIME", lambda r, now: _time(r)),
    "priority": ("PRIO", lambda r, now: str(r.get("priority", "-"))),
    "start": ("START BY", lambda r, now: start_by(r.get("expected_start"), now, r.get("no_estimate"))),
    "reason": ("REASON", lambda r, now: r.get("reason") or r.get("warning") or ""),
    "command": ("COMMAND", lambda r, now: r.get("command") or ""),
}
# squeue's -o letters, for those who type them: %i id, %u user, %T state, %r reason, ...
SQUEUE_LETTERS = {"i": "id", "u": "user", "T": "state", "t": "state", "r": "reason", "M": "time", "N": "where"}


def column_names(asked: str) -> list[str]:
    """The columns `--format` names (commas or squeue's %-letters); ValueError naming the unknown."""
    names = [SQUEUE_LETTERS.get(n, n) for n in asked.replace("%", ",").replace(" ", ",").split(",") if n]
    names = [n if n in SQUEUE_LETTERS.values() else n.lower() for n in names]
    if not names or any(n not in COLUMNS for n in names):
        raise ValueError(f"--format {asked!r}: choose columns from {', '.join(COLUMNS)}")
    return names


def jobs_table(view: dict[str, Any], names: list[str]) -> str:
    """The view's jobs, one line each, in the columns `names`."""
    view = safe_tree(view)
    rows = [
        *({**r, "state": "running"} for r in view["running"]),
        *({**r, "state": "pending"} for r in view["pending"]),
        *({**r, "state": "held"} for r in view["held"]),
        *view["finished"],
    ]
    lines = [[COLUMNS[n][0] for n in names]] + [[COLUMNS[n][1](r, view["now"]) for n in names] for r in rows]
    return "\n".join(line.rstrip() for line in table(lines, indent=""))
