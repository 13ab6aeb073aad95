"""Whether a job could ever run on the team's boxes, checked where it is written (submit) and
rewritten (edit): some GPU can hold it even with every job gone, some box has the cores and
memory it asks, the hosts it names exist, and its dependencies exist and have not failed."""

from __future__ import annotations

from dataclasses import replace

from gpuq import hooks
from gpuq.cli.common import read_config
from gpuq.host.faults import wall_time
from gpuq.model.config import Config
from gpuq.model.gpu import GpuSnapshot
from gpuq.model.jobs import HostView, PendingJob
from gpuq.model.spec import JobSpec
from gpuq.model.units import format_mib
from gpuq.sched.plan import plan
from gpuq.spool.layout import Layout
from gpuq.spool.submit import SubmitError, check_dependencies, check_runnable_by_workers
from gpuq.spool.teamstate import load_heartbeats


def _beyond_every_box(beats: list[dict], spec: JobSpec) -> str | None:
    """Why no box (of those the spec names) has the cores or the memory it asks for, and the
    fix; None when one has, or no box has said what it has (an older worker's heartbeat)."""
    boxes = [hb for hb in beats if not spec.hosts or hb.get("host") in spec.hosts]
    for asked, key, said, option in (
        (spec.cpus, "cores", lambda n: f"{n} cores", "-c/--cpus"),
        (spec.mem_mib, "mem_mib", lambda n: f"{format_mib(n)} of memory", "--mem"),
    ):
        offered = [(hb[key], str(hb.get("host"))) for hb in boxes if type(hb.get(key)) is int]
        if asked and offered and asked > max(offered)[0]:
            most, where = max(offered)
            return (
                f"no box has {said(asked)}: the most is {said(most)} ({where}). Fix: ask for at most that "
                f"with {option}. Nothing was written."
            )
    return None


def _never_fits(layout, spec) -> str | None:
    """Why no GPU (or box) of the team can ever hold `spec`, and the fix: another host list
    where it names no known box, else a smaller ask; None when it fits somewhere."""
    beats = load_heartbeats(layout)  # read once: the boxes, their GPUs, cores and memory
    if beyond := _beyond_every_box(beats, spec):
        return beyond
    known = sorted(str(hb.get("host")) for hb in beats)
    names_no_box = bool(spec.hosts and not set(spec.hosts) & set(known))
    hosts_fix = f"--hosts names boxes gpuq knows: {', '.join(known) or 'none has run a worker yet'}"
    refused = never_fits(beats, read_config(layout), PendingJob("(this job)", "", spec, 0.0))
    if refused is None:
        if names_no_box and known:  # a CPU-only job fits any box, but only among those named
            return (
                f"no box gpuq knows is named by hosts: {', '.join(spec.hosts)}. Fix: {hosts_fix}. Nothing was written."
            )
        return None
    fix = hosts_fix if names_no_box else "ask for less memory or fewer GPUs"
    return f"no GPU in the team can ever hold this job: {refused}. Fix: {fix}. Nothing was written."


def check_submittable(layout: Layout, config: Config, spec: JobSpec) -> None:
    """What a spec submitted must pass beyond its own fields: the submitter may run jobs here
    (whose the spec will be), and check_placeable. Raises SubmitError (or SpecError)."""
    check_runnable_by_workers(layout, config.run_for_users, config.allow_root_jobs, config.admins, spec)
    check_placeable(layout, spec)


def check_placeable(layout: Layout, spec: JobSpec, as_fields: bool = False) -> None:
    """What a spec must pass beyond its own fields, at submit and at edit alike (an edit keeps
    its job's owner): some GPU of the team can ever hold it, and its dependencies exist and
    have not failed. Raises SubmitError saying why and the fix (`as_fields`: naming the
    spec's fields, as `edit` shows them, not submit's options)."""
    if refused := _never_fits(layout, spec):
        raise SubmitError(refused)
    check_dependencies(layout, spec, as_fields)


def never_fits(heartbeats: list[dict], config: Config, job: PendingJob) -> str | None:
    """Why no host of the team could ever run `job`, even with every GPU empty (None when
    one could, or when no worker has ever reported its GPUs: nothing to judge by)."""
    beats = [hb for hb in heartbeats if hb.get("gpus") is not None]
    if not beats or job.spec.gpus == 0:
        return None
    empty = [
        HostView(
            hb["host"],
            tuple(replace(GpuSnapshot.from_json(g), mem_used_mib=0, processes=()) for g in hb["gpus"]),
            hb.get("cpu_slots", config.cpu_slots),
        )
        for hb in beats
    ]
    decided = plan([job], empty, [], config, wall_time(), explain=True, needs=hooks.needs_of(config))
    return None if decided.starts else decided.reasons.get(job.id)
