"""Starting a job's process: its environment, its identity, its log, and the order to the
root part that starts it (host/privsep.py).

Run in the supervisor, as the queue's account. The supervisor never enters a member's
directory nor runs a member's program: the job's own process, already its owner, opens the
log, enters the workdir and executes the command; everything else (venv, conda, setup) is
reached by the job's own shell. A job starts in its own process group with default signal
dispositions, stdout and stderr in its log, and no other descriptor.
"""

from __future__ import annotations

import functools
import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

from gpuq import hooks
from gpuq.host import rootorders, wire
from gpuq.host.owners import Identity
from gpuq.model.config import FENCE_FRACTION
from gpuq.model.environments import command_argv, prelude_lines
from gpuq.model.record import Record
from gpuq.model.sharing import pinned_mem_limit
from gpuq.model.spec import JobSpec
from gpuq.run.joblocal import Runtime

# A job that a root worker runs as its owner starts from this PATH, as a login shell would
# (docs/containers.md, "The job's environment"); a venv, conda or the spec's env adds to it.
JOB_PATH = "/usr/local/bin:/usr/bin:/bin"
_KEPT_FROM_THE_WORKER = ("LANG", "LANGUAGE", "TZ")  # and LC_*: how to print, not secrets


class CannotStart(Exception):
    """Why the attempt cannot start: its log and record say "cannot start: " and this.
    `log_fd`: the job's log, where its process could open it before it failed."""

    def __init__(self, message: str, log_fd: int | None = None) -> None:
        super().__init__(message)
        self.log_fd = log_fd


@functools.cache
def inherited_environment() -> dict[str, str]:
    """The worker's environment, less what gpuq sets per job. Computed once in the spawner
    (see supervise.prepare), so that each supervisor inherits it instead of rebuilding it."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("GPUQ_", "CUDA_VISIBLE"))}


def base_environment(identity: Identity | None) -> dict[str, str]:
    """What a process started for a job begins with, before the spec's env and gpuq's
    variables. Run as the worker's own account (a user's worker, or root's own job), it
    inherits the worker's environment, as a command started from the worker's shell would.
    Run by a root worker as the job's owner, it starts clean, as a login does: the owner's
    HOME, USER, LOGNAME and SHELL, JOB_PATH, and the worker's locale and TZ; root's other
    variables (a vault token, root's PATH) are never the owner's to see."""
    inherited = inherited_environment()
    if identity is None:
        return dict(inherited)
    env = {k: v for k, v in inherited.items() if k in _KEPT_FROM_THE_WORKER or k.startswith("LC_")}
    env.update(PATH=JOB_PATH, SHELL=_login_shell(identity), **identity.environment())
    return env


def shell_exit_note(exit_code: int | None, spec: JobSpec, identity: Identity | None) -> str | None:
    """Why a job's shell gave up on its command (exit 127: not found; 126: not executable),
    with the PATH and directory it had: a spec that works in a terminal often fails under
    cron's or a root worker's plainer PATH."""
    if exit_code not in (126, 127):
        return None
    path = spec.env["PATH"] if "PATH" in spec.env else base_environment(identity).get("PATH", "")  # "" is a PATH too
    workdir = spec.workdir or default_workdir(identity, "the queue root")
    where = f"the job's PATH was {path or '(empty)'} and it ran in {workdir}"
    if exit_code == 127:
        return (
            f"exit 127: no such command was found; {where}. Fix: give the command's full path, "
            "or set PATH in the spec's env (docs/containers.md: The job's environment)"
        )
    return (
        f"exit 126: the command was found but cannot be run (not executable, or a directory); {where}. "
        "Fix: chmod +x it, or run it through its interpreter (python script.py)"
    )


def _login_shell(identity: Identity) -> str:
    try:
        pw = pwd.getpwnam(identity.name)
    except KeyError:
        return "/bin/sh"
    return pw.pw_shell if pw.pw_uid == identity.uid and pw.pw_shell else "/bin/sh"


def job_identity(rt: Runtime, record: Record, as_owners: bool) -> Identity | None:
    """Whom the job runs as: its record's owner (the uid the worker took from the spec
    file and handed over with the record) where jobs run `as_owners` (the root part is root),
    or None for the starter's own account. A job runs as root only when the record says uid 0
    and allow_root_jobs is on: uid 0 is never "as myself" by default. Raises CannotStart."""
    if not as_owners:
        return None  # a user's worker runs its jobs as itself (run_for_users: on their behalf)
    if record.uid == 0:
        if rt.allow_root_jobs:
            return None
        raise CannotStart("the job's owner is root, and allow_root_jobs is off")
    if record.uid < 0:
        raise CannotStart(f"the record names no owner (uid {record.uid})")
    try:
        return Identity.of(record.uid)
    except KeyError:
        raise CannotStart(f"uid {record.uid}, the spec's owner, has no account here") from None


def job_variables(rt: Runtime, record: Record, spec: JobSpec) -> dict[str, str]:
    """What gpuq gives the job, on the host or inside a container: the spec's env, then
    gpuq's own variables (docs/containers.md, "The job's environment"). A spec's CUDA_MPS_*
    never reach it: only gpuq makes a job a client of its GPU's MPS daemon, within its share."""
    env = {k: v for k, v in spec.env.items() if not k.startswith("CUDA_MPS_")}
    env.update(rt.extra_env)
    env.update(
        {
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",  # so CUDA numbers GPUs as NVML does
            "CUDA_VISIBLE_DEVICES": ",".join(map(str, record.gpus)),
            "GPUQ_JOB_ID": record.id,
            "GPUQ_ATTEMPT": str(record.attempt),
            "GPUQ_GPU_MEM_MIB": str(record.gpu_mem_mib or 0),
            "GPUQ_PREEMPTIBLE": "1" if spec.preemptible else "0",
            "GPUQ_PREEMPTED": "1" if record.preempted else "0",  # resume from your checkpoint
            "GPUQ_HOST": rt.host,
            "GPUQ_ROOT": str(rt.layout.root),
        }
    )
    if record.restarts:
        env["GPUQ_RESTARTS"] = str(record.restarts)
    if record.cpu_cores:  # pinned: how many threads its data loaders and BLAS should start
        env["GPUQ_CPUS"] = str(len(record.cpu_cores))
    if record.mps_pipe and record.gpu_uuids:  # a client of its GPU's MPS daemon (the mps extra)
        env.update(
            {
                # The daemon's server sees only this GPU: named by UUID it is the same GPU
                # with MPS or (should the daemon be gone) without.
                "CUDA_VISIBLE_DEVICES": record.gpu_uuids[0],
                "CUDA_MPS_PIPE_DIRECTORY": record.mps_pipe,
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(record.mps_compute_pct or 100),
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": pinned_mem_limit(record.gpu_mem_mib or 0),
            }
        )
    return env


class OwnerCommands(Protocol):
    """A helper command run as the job's owner through the root part (`AsOwner`): a container
    client's stop or removal."""

    def run(self, argv: list[str], timeout: float) -> tuple[int | None, str]: ...
    def start(self, argv: list[str]) -> object: ...


class Companion(Protocol):
    """What a run holds outside its process tree, which the supervisor stops, kills and
    removes with it (a docker/podman container, which its runtime's daemon holds). None of
    its calls raises."""

    def stop(self, grace_s: float) -> None: ...  # with the job's SIGTERM; the kill follows the grace
    def kill(self) -> None: ...  # with the job's SIGKILL
    def remove(self) -> None: ...  # once the run has ended, however

    @property
    def due_at(self) -> float: ...  # when `tick` is due, on the monotonic clock (inf: never)

    def tick(self, now: float) -> None: ...


@dataclass(frozen=True)
class CompanionTools:
    """What the supervisor lends a run's companion: commands as the job's owner (with the
    admin's `env` for them), a line for the job's log, and `found`, to report a process of the
    job's started outside its tree (its GPU memory counts as the job's if it is the owner's)."""

    as_owner: Callable[[dict[str, str]], OwnerCommands]
    note: Callable[[str], None]
    found: Callable[[int], None]


@dataclass(frozen=True)
class Start:
    """One start of a job, as a launch wrapper (gpuq/hooks.py LaunchWrapper) is handed it:
    the job's command after its prelude (`argv`), the variables it must see (`variables`,
    CUDA_VISIBLE_DEVICES in host numbering), where, as whom, and the worker's settings
    (`rt.settings`: the config keys only extras read). `preview`: for `gpuq show`, which shows
    the command line without asking the host (clients by their bare names, no refusal)."""

    rt: Runtime
    record: Record
    spec: JobSpec
    identity: Identity | None
    argv: list[str]
    variables: dict[str, str]
    workdir: str
    base_env: dict[str, str]  # what a process started for the job begins with (base_environment)
    preview: bool = False


@dataclass(frozen=True)
class Wrapped:
    """How a wrapper starts the job instead: the argv and the whole environment the root part
    starts it with, its stdin (a file of the owner's own, such as an env file), and what the
    job sees inside (`seen`, for `gpuq show`). A `companion` makes the run's hold outside its
    process tree."""

    argv: list[str]
    env: dict[str, str]
    how: str  # the word of the job log's line that shows the command line ("container")
    label: str  # which one, for `gpuq show` ("docker")
    seen: dict[str, str]
    seen_from: str  # what the job's environment starts from, for `gpuq show`
    stdin: str | None = None
    companion: Callable[[CompanionTools], Companion] | None = None


@dataclass(frozen=True)
class Leftover:
    """An attempt whose supervisor died, as a launch wrapper's `recover` is handed it: its
    record, the worker's settings, and how to run a command as the job's owner (None: no root
    part to run it)."""

    rt: Runtime
    record: Record
    as_owner: Callable[[dict[str, str]], OwnerCommands] | None


@dataclass(frozen=True)
class Launch:
    """One start of a job's command: what is spawned, where, as whom."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    identity: Identity | None  # the spawned process's user (None: the supervisor's)
    wrapped: Wrapped | None = None


def default_workdir(identity: Identity | None, root: str) -> str:
    """Where a spec without `workdir` runs (one dropped by hand): its owner's home, where they
    may write, not the queue root that members cannot write; the root where the job runs as
    the worker's own account (a queue of one user's own), or where this box has no such home."""
    return identity.home if identity is not None and os.path.isdir(identity.home) else root


def build_launch(
    rt: Runtime, record: Record, spec: JobSpec, identity: Identity | None, preview: bool = False
) -> Launch:
    """The job's command (after its venv/conda/setup prelude), on the host with the worker's
    environment plus the job's variables, or as a launch wrapper of the extras says (through
    its container's runtime, whose container sees only the job's variables). Raises
    CannotStart, also for a spec field whose extra is not here."""
    workdir = spec.workdir or default_workdir(identity, str(rt.layout.root))
    inner = command_argv(spec.command, prelude_lines(spec.venv, spec.conda, spec.setup))
    variables = job_variables(rt, record, spec)
    base = base_environment(identity)
    start = Start(rt, record, spec, identity, inner, variables, workdir, base, preview)
    for wrap in wrappers_for(spec):
        wrapped = wrap(start)
        if wrapped is not None:
            return Launch(wrapped.argv, wrapped.env, workdir, identity, wrapped)
    env = {**base, **variables, **(identity.environment() if identity else {})}
    return Launch(inner, env, workdir, identity)


def wrappers_for(spec: JobSpec) -> list[Callable[[Start], Wrapped | None]]:
    """The extras' launch wrappers that apply to the job, loaded now. Raises CannotStart for
    a spec field no loaded extra gives (a spec taken in before its extra was deleted)."""
    for name in spec.extras:
        if (missing := hooks.missing_field(name)) is not None:
            raise CannotStart(f"{name}: {missing[0]}. Fix: {missing[1]}")
    return [
        hooks.load(w.wrap)
        for w in hooks.registry().launch_wrappers
        if w.field is None or spec.extras.get(w.field) is not None
    ]


def prepare_log(path: Path, owner: Identity | None, orders: rootorders.Orders | None) -> None:
    """The job's log exists, for its owner: made 0640 by the queue's account when missing (in
    a team root, logs/ is setgid: the team's group reads it), then given to the owner by the
    root part. The job's own process (or Slurm, for the bridge) opens it as its owner. One that
    is there already must be a plain file of the owner's with one link: a name planted in
    logs/ must not have anything of the job's written through it. Raises CannotStart."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640)
    except FileExistsError:
        uid = owner.uid if owner is not None else os.geteuid()
        try:
            st = os.lstat(path)
        except OSError as e:
            raise CannotStart(f"log {path.name}: {e.strerror}") from None
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_uid != uid:
            whose = owner.name if owner is not None else "this worker's user"
            raise CannotStart(
                f"log {path.name} exists and is not a plain file of {whose} (a link, a FIFO or another's file: "
                f"never written through). Fix: an admin removes logs/{path.name}, then `gpuq retry` the job"
            ) from None
        return
    try:
        os.fchmod(fd, 0o640)  # whatever the umask
        if owner is None or owner.uid == os.geteuid():
            return
        if os.geteuid() == 0:  # root's own queue: its worker is root, and no team's group is kept
            team_dir = os.stat(path.parent).st_mode & stat.S_ISGID
            os.fchown(fd, owner.uid, -1 if team_dir else owner.gid)
        elif orders is not None:
            orders.give(fd, owner.uid)
    except wire.Refused as e:
        raise CannotStart(f"cannot give its log to {owner.name if owner else 'its owner'}: {e}") from None
    finally:
        os.close(fd)


def start_run(
    rt: Runtime,
    orders: rootorders.Orders,
    record: Record,
    launch: Launch,
    fds: dict[str, int],
    header: str,
) -> rootorders.Keeper:
    """Start one run of the job (its first, or a service's restart) under a keeper, through
    the root part: as its owner, in its workdir, pinned to its cores, its output in its log.
    `fds`: the descriptors the keeper gets (the claimed spec, the job lock, the lease, the exit
    file). Raises CannotStart with the reason (and the log, where the job could open it)."""
    identity = launch.identity
    prepare_log(rt.layout.job_log(record.id), identity, orders)
    logs_fd = os.open(rt.layout.logs, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return orders.start(
            {
                "uid": identity.uid if identity is not None else orders.starter_uid,
                "argv": launch.argv,
                "env": launch.env,
                "cwd": launch.cwd,
                "cores": record.cpu_cores,
                "log": rt.layout.job_log(record.id).name,
                "header": header,
                "grace_s": rt.grace_s,
                "fence_after_s": FENCE_FRACTION * rt.lost_after_s,
                "stdin": launch.wrapped.stdin if launch.wrapped is not None else None,
            },
            {**fds, "logs": logs_fd},
        )
    except wire.Refused as e:
        raise CannotStart(str(e), e.log_fd) from None
    finally:
        os.close(logs_fd)


@dataclass(frozen=True)
class AsOwner:
    """A job's helper commands (a container client's stop, kill, rm, inspect), run as the
    job's owner through the root part, like the job itself: `spec_fd` is the claimed spec it
    checks."""

    orders: rootorders.Orders
    uid: int
    env: dict[str, str]
    spec_fd: int | None

    def run(self, argv: list[str], timeout: float, stdin: str | None = None) -> tuple[int | None, str]:
        return self.orders.run(self.uid, argv, self.env, self.spec_fd, stdin=stdin, timeout=timeout)

    def start(self, argv: list[str]) -> rootorders.Keeper:
        return self.orders.start(
            {"uid": self.uid, "argv": argv, "env": self.env, "cwd": "/"},
            ({"spec": self.spec_fd} if self.spec_fd is not None else {}),
        )


def as_owner(
    rt: Runtime, orders: rootorders.Orders, record: Record, spec_fd: int | None, extra_env: dict[str, str] | None = None
) -> AsOwner:
    """How to run a command as the owner of `record`'s job (the starter's own user, where jobs
    do not run as their owners), with the clean environment a job starts from, and `extra_env`
    (the admin's: config container_env for a container's client)."""
    identity = job_identity(rt, record, orders.starter_uid == 0)
    uid = identity.uid if identity is not None else orders.starter_uid
    env = {**base_environment(identity), **(extra_env or {}), **(identity.environment() if identity else {})}
    return AsOwner(orders, uid, env, spec_fd)
