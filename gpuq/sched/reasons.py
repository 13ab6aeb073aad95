"""Why a pending job waits, in words a user can act on (shown by `gpuq status`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Collection, Sequence

from gpuq.model.config import Config
from gpuq.model.jobs import HostView
from gpuq.model.spec import JobSpec
from gpuq.model.units import format_duration, format_mib
from gpuq.model.windows import hhmm, moment
from gpuq.sched import placement, setasides
from gpuq.sched.placement import Slot


def hosts_text(spec: "JobSpec") -> str:
    return f" among hosts {', '.join(spec.hosts)}" if spec.hosts else ""


def why_runtime(runtime: str, hosts: Sequence["HostView"]) -> str:
    """No allowed host has the container runtime the job needs."""
    have = "; ".join(f"{h.name}: {', '.join(sorted(h.runtimes or ())) or 'none'}" for h in hosts[:4])
    return f"needs container runtime {runtime}, which no live host has ({have}{'; ...' if len(hosts) > 4 else ''})"


def why_no_host(spec: "JobSpec", hosts: Sequence["HostView"], drained: Collection[str]) -> str:
    """No live host may take the job: the ones it names are down or drained, or no worker runs
    (a job pinned to a drained box read "no live host", of a box that was up)."""
    draining = sorted(set(spec.hosts or drained) & set(drained))
    if draining:
        named = f"host{'s' if len(draining) > 1 else ''} {', '.join(draining)}"
        return f"{named} draining (`gpuq resume {draining[0]}` takes work again)" + (
            f"; no other live host{hosts_text(spec)}" if spec.hosts and len(draining) < len(spec.hosts) else ""
        )
    return f"no live host{hosts_text(spec)}" if hosts else "no worker is running"


def why_cpu(spec: "JobSpec", allowed: list[str], hosts: Sequence["HostView"], drained: Collection[str] = ()) -> str:
    if not allowed:
        return why_no_host(spec, hosts, drained)
    return f"all CPU-only slots are busy{hosts_text(spec)}"


def why_gpu(
    spec: "JobSpec",
    allowed: list[str],
    slots: list["Slot"],
    hosts: Sequence["HostView"],
    config: "Config",
    drained: Collection[str] = (),
) -> str:
    """The first thing, from the most fundamental, that keeps an ordinary job off every GPU."""
    need = (
        "a whole GPU"
        if spec.exclusive
        else f"{format_mib(spec.gpu_mem_mib)} on {'one GPU' if spec.gpus == 1 else 'each GPU'}"
    )
    count = "" if spec.gpus == 1 else f"{spec.gpus} GPUs on one host, "
    if not allowed:
        return why_no_host(spec, hosts, drained)
    mine = [g for g in slots if g.host in allowed]
    if not mine:
        return f"no GPUs offered{hosts_text(spec)}"
    per_host = {h: sum(1 for g in mine if g.host == h) for h in allowed}
    widest = max(per_host.values())
    if widest < spec.gpus:
        return f"needs {spec.gpus} GPUs on one host; the most any host offers is {widest}"
    biggest = max(mine, key=lambda g: (g.total, g.host, -g.index))
    if not spec.exclusive and biggest.whole < spec.gpu_mem_mib:  # type: ignore[operator]
        return f"needs {need}; the largest GPU holds {format_mib(biggest.whole)} usable ({biggest.label})"
    roomy = [g for g in mine if g.jobs < config.max_jobs_per_gpu]
    if not roomy:
        return f"every GPU{hosts_text(spec)} has max_jobs_per_gpu={config.max_jobs_per_gpu} jobs"
    free = lambda g: g.free
    if spec.exclusive:
        n = sum(1 for g in roomy if g.jobs == 0 and g.others_clear and free(g) >= g.whole)
        return f"needs {count}{need}; {n} GPU{'s are' if n != 1 else ' is'} wholly free{hosts_text(spec)}"
    largest = max(roomy, key=lambda g: (free(g), g.host, -g.index))
    fitting = {h: sum(1 for g in roomy if g.host == h and free(g) >= spec.gpu_mem_mib) for h in allowed}
    if spec.gpus > 1 and free(largest) >= spec.gpu_mem_mib:
        host, n = max(fitting.items(), key=lambda kv: (kv[1], kv[0]))
        return f"needs {count}{need}; at most {n} such GPU{'s' if n != 1 else ''} on {host}"
    return f"needs {count}{need}; most free now is {format_mib(max(0, free(largest)))} on {largest.label}"


def why_held(
    slots: list["Slot"], job_id: str, spec: "JobSpec", runs_s: float, now: float, runs: str, max_jobs: int
) -> str | None:
    """When the job would fit but for GPUs held for another job: that job's name, and, for the
    head of the queue's reservation, why this one may not run before it (`runs_s`: how long
    it may hold its GPUs, `runs` what that is: its time limit, or a learned run, and its
    stop's grace; inf: no limit known)."""
    held = sorted((s for s in slots if s.held_for and s.held_for != job_id), key=lambda s: (s.held_for, s.label))
    if not held or not placement.best_fit(spec, [_unheld(s) for s in slots], max_jobs):
        return None  # too small, held or not
    slot = held[0]
    holder = slot.held_for
    more = len({s.held_for for s in held})
    reason = f"GPU reserved for job {holder}" + (f" (and {more - 1} more)" if more > 1 else "")
    if slot.reserved_from == float("inf"):
        return reason
    if runs_s == float("inf"):
        return f"{reason} from {moment(slot.reserved_from, now)}; with a time_limit that ends by then it could run now"
    return f"{reason} from {moment(slot.reserved_from, now)}; {runs} ({format_duration(runs_s)}) run past that"


def _unheld(slot: "Slot") -> "Slot":
    """The slot as it would be without holds (to tell "reserved" from "too small")."""
    return replace(slot, free=max(slot.free, slot.free_opportunistic), held_for=None, hard_held=False, reserved_mib=0)


def why_booked(
    spec: "JobSpec",
    user: str,
    mine: list["Slot"],
    reachable: list["Slot"],
    config: "Config",
    ends_by: float,
    now: float,
    runs: str,
) -> str | None:
    """GPUs it would fit on but for someone else's booking: now, or from a moment its run
    (until `ends_by`; `runs` says what tells that) would reach."""
    others_booked = [s for s in reachable if s.booked_for not in (None, user)]
    if others_booked and (s := setasides.booked_in(spec, mine, others_booked, config)) is not None:
        return f"GPU {s.label} booked for {s.booked_for} until {hhmm(s.booked_until)}"
    coming = [s for s in reachable if setasides.booked_before(s, user, ends_by)]
    if coming and (s := setasides.booked_in(spec, mine, coming, config)) is not None:
        start, owner = setasides.booked_before(s, user, ends_by)  # type: ignore[misc]
        how = "has no time limit" if ends_by == float("inf") else f"may run past that ({runs})"
        return f"GPU {s.label} booked for {owner} from {moment(start, now)}; this job {how}"
    return None


def why_mps(spec: "JobSpec", user: str, slots: list["Slot"], max_jobs: int, opportunistic: bool = False) -> str | None:
    """The GPUs it would fit on but for another user's MPS jobs there, said as such."""
    taken = [s for s in slots if not placement.serves_mps_user(s, user, opportunistic)]
    fit = placement.best_fit(
        spec,
        [replace(s, mps_users=frozenset(), opp_mps_users=frozenset()) for s in taken],
        max_jobs,
        opportunistic=opportunistic,
    )
    if not fit:
        return None
    s = next(t for t in taken if t.label == fit[0].label)
    others = ", ".join(sorted((s.mps_users | (s.opp_mps_users if opportunistic else set())) - {user}))
    return (
        f"GPU {s.label} runs {others}'s jobs under MPS, which serves one user per GPU "
        "(config gpu_sharing: mps); it waits for a GPU without them"
    )


def why_lingers(
    spec: "JobSpec", kept_off: list["Slot"], max_jobs: int, grace_s: float, lingers: bool, now: float
) -> str | None:
    """An opportunistic job that would fit on GPUs reserved for the head of the queue, kept
    off them (`kept_off`) for its grace: longer than the config's (`lingers`), or too long to
    start there now and be gone when the head is due: said so."""
    fit = placement.best_fit(spec, kept_off, max_jobs, opportunistic=True)
    if fit is None:
        return None
    s, grace = fit[0], format_duration(grace_s)
    if lingers:
        return (
            f"opportunistic: GPU {s.label} is reserved for job {s.held_for}, and this job's grace "
            f"({grace}, longer than grace_s) could keep it waiting"
        )
    return (
        f"opportunistic: GPU {s.label} is reserved for job {s.held_for} from {moment(s.reserved_from, now)}, "
        f"too soon to start there and yield in time (its grace {grace})"
    )


def why_not_idle(spec: "JobSpec", slots: list["Slot"], idle_after_s: float) -> str:
    """An opportunistic job that finds no idle GPU (on its hosts): whom the GPUs are busy with."""
    waits = f"opportunistic: waits for an idle GPU{hosts_text(spec)}"
    busy = [s.label for s in slots if s.busy_by_others]
    if busy:
        return f"{waits} (in use by others: {', '.join(busy)})"
    if all(s.jobs for s in slots):  # not "idle for under 60s": the GPUs are simply full of jobs
        return f"{waits} (every GPU runs ordinary jobs)"
    return f"{waits} (idle for under {idle_after_s:g}s)"


def why_opportunistic(
    spec: "JobSpec", allowed: list[str], slots: list["Slot"], hosts: Sequence["HostView"], config: "Config"
) -> str:
    """An opportunistic job takes only idle GPUs that no ordinary job uses or waits for."""
    if not allowed or not slots:
        return why_gpu(spec, allowed, slots, hosts, config)
    idle = [s for s in slots if s.idle]
    if not idle:
        return why_not_idle(spec, slots, config.idle_after_s)
    left = [s for s in idle if not s.jobs and not s.hard_held]
    if not left:
        return f"opportunistic: every idle GPU{hosts_text(spec)} has ordinary work on it or held for it"
    need = "a whole GPU" if spec.exclusive else f"{format_mib(spec.gpu_mem_mib)}"
    largest = max(left, key=lambda g: (g.opportunistic_room, g.host, -g.index))
    return (
        f"opportunistic: needs {need}{'' if spec.gpus == 1 else f' on {spec.gpus} GPUs of one host'}; "
        f"the most left by other work is {format_mib(max(0, largest.opportunistic_room))} on {largest.label}"
    )
