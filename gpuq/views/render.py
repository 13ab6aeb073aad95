"""Text rendering of the status screen (`status`, `top`, `status --shares`) and the pieces every
view's text shares (times, tables, where a job runs); `show`'s text is views/show.py's.

Everything a spec, a record or a heartbeat says is text someone else wrote, and it reaches the
terminal of whoever looks (root included). So each renderer first passes its whole view
through `safe_tree`: a job name or command with ESC, a newline or a bidi override is shown as
`\\x1b`, `\\n`, `\\u202e` instead of being acted on. Times come from files too, and a damaged
one prints "?" instead of stopping the screen.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

from gpuq import hooks
from gpuq.model.text import safe_tree
from gpuq.model.units import format_duration, format_mib
from gpuq.model.windows import moment
from gpuq.sched.fairshare import rank_score

PENDING_SHOWN = 20
REASONS_SHOWN = 6  # below the pending rows: how many wait for each reason, the commonest


def stamp(t: Any, fmt: str = "%Y-%m-%d %H:%M:%S") -> str:
    """A time from a file, formatted; "?" for what is not a usable time (NaN, 1e300, text),
    which time.localtime would raise on."""
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
        return "?"
    try:
        return time.strftime(fmt, time.localtime(t))
    except (OverflowError, OSError, ValueError):
        return "?"


def table(rows: list[list[str]], indent: str = "  ") -> list[str]:
    if not rows:
        return []
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return [indent + "  ".join([*(c.ljust(w) for c, w in zip(r, widths)), r[-1]]) for r in rows]


def where(host: Any, gpus: Any) -> str:
    """Where a job runs or ran, one way on every screen: `a:0,1`, `a:cpu` (CPU only), `-` (nowhere yet)."""
    if not host:
        return "-"
    return f"{host}:{','.join(map(str, gpus))}" if isinstance(gpus, list) and gpus else f"{host}:cpu"


def start_by(expected: Any, now: float, why_none: Any = None) -> str:
    """A pending job's expected start (sched/estimate.py) in a few characters: "now", a time
    today, a day and a time later; without one, why in a word or two ("unknown": a job ahead
    has no time limit; "no room": it fits nowhere even once the jobs ahead end; "after deps", "after begin",
    "when idle", "later": over 90 days; "-": not estimated)."""
    if not isinstance(expected, (int, float)) or isinstance(expected, bool):
        return why_none if isinstance(why_none, str) and why_none else "-"
    if expected <= now + 1:
        return "now"
    return moment(expected, now)


def _clock(t: float | None) -> str:
    return stamp(t, "%H:%M:%S") if t else "-"


def status_text(view: dict[str, Any], show_all: bool = False, only: frozenset[str] | None = None) -> str:
    """The status screen; `only`: just these sections of jobs (`status --state`: running,
    pending, held, finished, ...), without HOSTS and what is not about those jobs."""
    view = safe_tree(view)
    shown = lambda section: only is None or section in only  # noqa: E731
    out = [f"gpuq · {view['root']} · {stamp(view['now'])}"]
    if only is None:
        out += ["", *_hosts_section(view), *_extras_sections(view, after="HOSTS")]
    out += _running_section(view) + _extras_sections(view, after="RUNNING") if shown("running") else []
    out += _pending_section(view, show_all) + _extras_sections(view, after="PENDING") if shown("pending") else []
    out += _held_section(view) + _extras_sections(view, after="HELD") if shown("held") else []
    for log, n in sorted(view.get("skipped_events", {}).items()):
        out.append(f"  ! state/events/{log}: {n} line(s) that are not gpuq's events were skipped (gpuq doctor)")
    out += _stranded_section(view) if shown("stranded") else []
    out += _finished_section(view) if shown("finished") else []
    out += _rejected_section(view) if shown("rejected") else []
    out += _not_specs_section(view) if only is None else []
    return "\n".join(out)


def _hosts_section(view: dict[str, Any]) -> list[str]:
    out = [
        "HOSTS"
        if view["hosts"]
        else "HOSTS: none — no worker has run yet (each box's crontab starts one: "
        "gpuq doctor, run by the root's owner, prints the line)"
    ]
    for h in view["hosts"]:
        out += _host_lines(view, h)
    return out


def _host_lines(view: dict[str, Any], h: dict[str, Any]) -> list[str]:
    """One host's line (its state, drain, probe error, container runtimes) and its GPUs' table."""
    state = "up" if h["alive"] else "stopped (its worker exited cleanly)" if h.get("stopped") else "NOT RESPONDING"
    if h.get("drain"):
        busy = sum(1 for r in view["running"] if r["host"] == h["host"])
        state += (
            (f", DRAINING ({busy} running)" if busy else ", DRAINED")
            + f" by {h['drain']['by']}"
            + (f": {h['drain']['reason']}" if h["drain"].get("reason") else "")
        )
    extra = f"  {h['probe_error']}" if h.get("probe_error") else ""
    runtimes = [f"{n} {v}" for n, v in sorted(h.get("runtimes", {}).items())] + [
        f"{n} unusable ({why[:50]}{'…' if len(why) > 50 else ''}; see gpuq doctor)"
        for n, why in sorted(h.get("runtime_problems", {}).items())
    ]
    extra += f"  containers: {', '.join(runtimes)}" if runtimes and view.get("containers_asked") else ""
    out = [f"  {h['host']}  {state} (seen {format_duration(h['last_seen_s'])} ago){extra}"]
    rows = [["GPU", "NAME", "MEM USED/TOTAL", "USABLE", "UTIL", "TEMP", "JOBS"]]
    for g in h["gpus"]:
        rows.append(
            [
                str(g["index"]),
                g["name"],
                f"{format_mib(g['mem_used_mib'])}/{format_mib(g['mem_total_mib'])}",
                format_mib(g["usable_mib"]),
                "-" if g["util_pct"] is None else f"{g['util_pct']}%",
                "-" if g["temp_c"] is None else f"{g['temp_c']}C",
                " ".join(g["jobs"]) or "-",
            ]
        )
    out += table(rows, "    ") if h["gpus"] else ["    no GPUs"]
    return out


def _running_section(view: dict[str, Any]) -> list[str]:
    out = ["", f"RUNNING ({len(view['running'])})"]
    rows = [["ID", "USER", "WHERE", "ELAPSED", "GPU MEM decl/obs", "COMMAND"]]
    for r in view["running"]:
        place = f"slurm job {r['slurm_id']}" if r.get("slurm_id") else where(r["host"], r["gpus"])
        declared = (
            format_mib(r["declared_gpu_mem_mib"]) if r["declared_gpu_mem_mib"] else ("whole" if r["gpus"] else "-")
        )
        label = (
            r["id"]
            + (" (low)" if r.get("preemptible") else "")  # opportunistic: it yields to others' work
            + (" (yielding)" if r.get("yielding") else " (stopping)" if r.get("stopping") else "")
            + (f" (restarts {r['restarts']})" if r.get("restarts") else "")
            # Its box's worker is silent: its keeper stops the job (fenced) before others take it over.
            + (" (host silent)" if r.get("host_silent") else "")
        )
        rows.append(
            [
                label,
                r["user"],
                place,
                format_duration(r["elapsed_s"]),
                f"{declared}/{format_mib(r['observed_gpu_mem_mib'])}",
                _cut(r["command"], 40),
            ]
        )
    out += table(rows) if view["running"] else []
    out += [f"  ! {r['id']} {r['warning']}" for r in view["running"] if r.get("warning")]
    return out


def _pending_section(view: dict[str, Any], show_all: bool) -> list[str]:
    """The first PENDING_SHOWN pending jobs (all with show_all), how many wait for each reason
    when some are left out, and the specs not valid yet."""
    pending = view["pending"]
    total = view["pending_total"]
    out = ["", f"PENDING ({total})"]
    rows = [["#", "ID", "USER", "ASK", "PRIO", "WAITING", "START BY", "REASON"]]
    folded = _fold_pending(pending, view.get("group_sizes", {}))
    shown = folded if show_all else folded[:PENDING_SHOWN]
    for p in shown:
        rows.append(
            [
                p.get("positions") or str(p["position"]),
                p["id"],
                p["user"],
                ask(p["gpus"], p["gpu_mem_mib"]),
                str(p["priority"]),
                format_duration(p["waiting_s"]),
                start_by(p.get("expected_start"), view["now"], p.get("no_estimate")),
                p["reason"],
            ]
        )
    out += table(rows) if pending else []
    left = total - sum(p.get("folded", 1) for p in shown)
    if not show_all and left > 0:
        out.append(f"  ... and {left} more (gpuq status --all). All {total} wait for:")
        by_reason = list(view.get("pending_by_reason", {}).items())
        out += [f"    {n:6d}  {reason}" for reason, n in by_reason[:REASONS_SHOWN]]
        if len(by_reason) > REASONS_SHOWN:
            out.append(
                f"    {sum(n for _, n in by_reason[REASONS_SHOWN:]):6d}  {len(by_reason) - REASONS_SHOWN} other reasons"
            )
    for bad in view["invalid"]:
        out.append(f"  not valid yet: {bad['error']}")
    return out


def _extras_sections(view: dict[str, Any], after: str) -> list[str]:
    """The extras' sections that follow the core's section `after` (hooks.py `views`: the
    alerts extra's ALERTS, the bookings extra's BOOKINGS), each from its part of the view
    (already safe text); none while it has nothing to show."""
    out: list[str] = []
    for section in (s for s in hooks.registry().views if s.after == after):
        render: Callable[[Any], list[str]] = hooks.load(section.render)
        out += render(view.get(section.name))
    return out


def _held_section(view: dict[str, Any]) -> list[str]:
    if not view.get("held"):
        return []
    rows = _fold_held(view["held"], view.get("group_sizes", {}))
    return ["", f"HELD ({len(view['held'])}; gpuq release ID puts one back at its place)"] + table(
        [["ID", "USER", "SINCE", "NOTE"]] + [[h["id"], h["user"], _clock(h["since"]), h["reason"]] for h in rows]
    )


def _fold_held(held: list[dict[str, Any]], sizes: dict[str, int]) -> list[dict[str, Any]]:
    """Held members of one array or sweep in a row, held alike (owner, note), one line:
    `hp-1_* (30 of 30)`, since the first of them was held (`gpuq release hp-1` releases all)."""

    def key(h: dict[str, Any]) -> tuple | None:
        group = h["id"].rpartition("_")[0]
        return (group, h["user"], h["reason"]) if group in sizes else None

    def one_line(run: list[dict[str, Any]]) -> dict[str, Any]:
        group = run[0]["id"].rpartition("_")[0]
        since = min((h["since"] for h in run if h["since"] is not None), default=None)
        return {**run[0], "id": f"{group}_* ({len(run)} of {sizes[group]})", "since": since}

    return _fold_runs(held, key, one_line)


def _not_specs_section(view: dict[str, Any]) -> list[str]:
    strays = view.get("not_specs") or {}
    if not strays.get("files"):
        return []
    out = ["", f"NOT SPECS ({strays['total']} in jobs/; gpuq reads only NAME.yaml and NAME.yml)"]
    out += table(
        [["FILE", "USER", "AGE", "TO DO"]]
        + [[f["name"], f["user"], format_duration(f["age_s"]), f["fix"]] for f in strays["files"]]
    )
    if strays["total"] > len(strays["files"]):
        out.append(f"  ... and {strays['total'] - len(strays['files'])} more (ls -la jobs/)")
    return out


def _stranded_section(view: dict[str, Any]) -> list[str]:
    if not view.get("stranded"):
        return []
    hosts = sorted({j["host"] for j in view["stranded"]})
    return [
        "",
        f"STRANDED ({len(view['stranded'])}; claimed by {', '.join(hosts)}, which stopped before starting them: "
        f"they start when its worker is back, or return to the queue with `gpuq forget HOST`)",
    ] + table([["ID", "USER", "HOST"]] + [[j["id"], j["user"], j["host"]] for j in view["stranded"]])


def _finished_section(view: dict[str, Any]) -> list[str]:
    out = ["", "FINISHED (recent)"]
    rows = [["ID", "STATE", "EXIT", "DURATION", "WHERE", "ENDED", "NOTE"]]
    for f in _fold_groups(view["finished"], view.get("group_sizes", {})):
        exit_text = "-" if f.get("exit_code") is None else str(f["exit_code"])
        if f.get("signal"):
            exit_text = f"sig{f['signal']}"
        gpus = f.get("gpus") or []
        where = f"{f.get('host') or '-'}:{','.join(map(str, gpus))}" if gpus else (f.get("host") or "-")
        rows.append(
            [
                f["id"],
                f["state"],
                exit_text,
                format_duration(f.get("duration_s")),
                where,
                _clock(f.get("ended_at")),
                f.get("reason") or "",
            ]
        )
    out += table(rows) if view["finished"] else []
    return out


def _rejected_section(view: dict[str, Any]) -> list[str]:
    if not view["rejected"]:
        return []
    out = ["", "REJECTED (recent; the .error file beside each in state/rejected/ says why)"]
    for r in view["rejected"]:  # what is wrong, then its fix on a line of its own: a cut never hides it
        what, has_fix, fix = (r["error"] or "").partition(" Fix: ")
        out += [f"  {r['id']}: {_cut(what, 150)}"] + ([f"    Fix: {_cut(fix, 150)}"] if has_fix else [])
    return out


def shares_text(view: dict[str, Any]) -> str:
    """`gpuq status --shares` (Slurm's sprio and sshare): each user's usage and fair-share
    factor, and the pending jobs in the order the workers take them, with what ranks them."""
    view = safe_tree(view)
    out = [f"gpuq · {view['root']} · {stamp(view['now'])}", ""]
    if not view["fair_share"] and not view.get("fair_share_on", True):
        return "\n".join(out + ["fair share is off (config fair_share: false): jobs go by priority, then age"])
    out.append("FAIR SHARE (usage: GPU-hours, each halved every fair_share_half_life; factor 2^-(usage/share))")
    rows = [["USER", "USAGE", "HOLDS", "PENDING", "FACTOR"]]
    for r in view["fair_share"]:
        usage, holds = f"{r['usage_gpu_h']:.2f}", f"{r['holds_gpus']:g}"
        rows.append([r["user"], usage, holds, str(r["pending"]), f"{r['factor']:.3f}"])
    out += table(rows)
    factor = {r["user"]: r["factor"] for r in view["fair_share"]}
    out += ["", "PENDING, in the order jobs start (priority class, then SCORE: 10000 x factor + 1000 x weeks waited)"]
    rows = [["#", "ID", "USER", "PRIORITY", "FACTOR", "WAITING", "SCORE"]]
    for p in view["pending"]:
        score = rank_score(factor.get(p["user"], 1.0), p["waiting_s"])
        rows.append(
            [
                str(p["position"]),
                p["id"],
                p["user"],
                str(p["priority"]),
                f"{factor.get(p['user'], 1.0):.3f}",
                format_duration(p["waiting_s"]),
                f"{score:,.0f}",
            ]
        )
    out += table(rows)
    return "\n".join(out)


# `gpuq top` on a terminal: what a person watches first comes first (the extras' sections
# after the core's section they follow on the status screen).
TOP_ORDER = ("RUNNING", "PENDING", "HOSTS", "HELD", "REJECTED", "FINISHED")


def top_screen(title: str, status: str, columns: int, rows: int) -> list[str]:
    """The status screen fitted to a terminal of `columns` x `rows`: its sections reordered
    (running and pending first), each line clipped, never wrapped (a job stays on one line),
    and cut after the rows there are, the last one saying how much is left out."""
    blocks = [block.splitlines() for block in status.split("\n\n")]
    head, sections = blocks[0], blocks[1:]
    order = tuple(
        title for core in TOP_ORDER for title in (core, *(s.title for s in hooks.registry().views if s.after == core))
    )
    sections.sort(key=lambda lines: next((i for i, name in enumerate(order) if lines[0].startswith(name)), len(order)))
    lines = [title, *head]
    for section in sections:
        lines += ["", *section]
    if len(lines) > rows:
        left = len(lines) - (rows - 1)
        lines = lines[: rows - 1] + [f"... {left} more lines (gpuq status --all shows everything)"]
    return [clip(line, columns) for line in lines]


FOLD_AT_LEAST = 3


def _fold_pending(pending: list[dict[str, Any]], sizes: dict[str, int]) -> list[dict[str, Any]]:
    """Rows in a row that are members of one array or sweep and wait alike (owner, ask,
    priority, reason), one line: `hp-1_* (30 of 30)` at positions `1-30`. A member that
    waits for something else keeps its own line."""

    def key(p: dict[str, Any]) -> tuple | None:
        group = p["id"].rpartition("_")[0]
        return (group, p["user"], p["gpus"], p["gpu_mem_mib"], p["priority"], p["reason"]) if group in sizes else None

    def one_line(run: list[dict[str, Any]]) -> dict[str, Any]:
        group = run[0]["id"].rpartition("_")[0]
        positions = f"{run[0]['position']}-{run[-1]['position']}"
        return {**run[0], "id": f"{group}_* ({len(run)} of {sizes[group]})", "positions": positions, "folded": len(run)}

    return _fold_runs(pending, key, one_line)


def _fold_runs(
    rows: list[dict[str, Any]],
    key: Callable[[dict[str, Any]], tuple | None],
    one_line: Callable[[list[dict[str, Any]]], dict[str, Any]],
) -> list[dict[str, Any]]:
    """`rows` with each run of FOLD_AT_LEAST or more in a row of one `key` (None: never folded)
    made one line by `one_line`."""
    out: list[dict[str, Any]] = []
    run: list[dict[str, Any]] = []
    for row in [*rows, None]:  # None: the end, which closes the last run
        if run and (row is None or key(row) != key(run[0])):
            out += [one_line(run)] if len(run) >= FOLD_AT_LEAST else run
            run = []
        if row is not None:
            (out if key(row) is None else run).append(row)
    return out


def ask(gpus: int, gpu_mem_mib: int | None) -> str:
    """What a job asks for, in a few characters: `1x20GiB` (memory per GPU), `2 GPUs` (whole), `cpu`."""
    if not gpus:
        return "cpu"
    if gpu_mem_mib:
        return f"{gpus}x{format_mib(gpu_mem_mib)}"
    return f"{gpus} GPU{'s' if gpus != 1 else ''}"


def clip(line: str, columns: int) -> str:
    """A line cut to `columns`, with … where it was cut (never wrapped: a job stays one line)."""
    return line if len(line) <= columns else line[: max(columns - 1, 0)] + "…"


def _fold_groups(finished: list[dict[str, Any]], sizes: dict[str, int]) -> list[dict[str, Any]]:
    """Rows in a row that are members of one array or sweep (`<group>_<member>`) and ended the
    same way without running, one line: a cancelled array of 100 is not 100 lines. FINISHED
    lists only the latest `recent_finished` jobs, so the line says how many of how many."""

    def key(f: dict[str, Any]) -> tuple | None:
        group = f["id"].rpartition("_")[0]
        return (group, f["state"], f.get("reason")) if group and not f.get("duration_s") else None

    def one_line(run: list[dict[str, Any]]) -> dict[str, Any]:
        group = run[0]["id"].rpartition("_")[0]
        size = sizes.get(group)
        shown = (
            f"all {size} members"
            if size == len(run)
            else f"the latest {len(run)} of its {size} members"
            if size
            else f"its latest {len(run)} members"
        )
        return {**run[0], "id": f"{group}_* ({shown})"}

    return _fold_runs(finished, key, one_line)


def _cut(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"
