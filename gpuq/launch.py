"""Starting a job's process: its environment, its identity, its log, and the spawn itself.

Run in the supervisor. A job starts in its own process group with default signal
dispositions, stdout and stderr in its log, and the job lock's descriptor inherited.
"""
from __future__ import annotations

import errno
import functools
import os
import shlex
import signal
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .containers import ContainerControl, ContainerRun, Owner, container_name, container_run
from .environments import command_argv, prelude_lines
from .joblocal import Runtime, write_container_pid
from .limits import pinned
from .owners import Identity
from .spec import JobSpec
from .spool import Record


@functools.cache
def inherited_environment() -> dict[str, str]:
    """The worker's environment, less what gpuq sets per job. Computed once in the spawner
    (see supervise.prepare), so that each supervisor inherits it instead of rebuilding it."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("GPUQ_", "CUDA_VISIBLE"))}


def job_variables(rt: Runtime, record: Record, spec: JobSpec) -> dict[str, str]:
    """What gpuq gives the job, on the host or inside a container: the spec's env, then
    gpuq's own variables (README "The job's environment")."""
    env = dict(spec.env)
    env.update(rt.extra_env)
    env.update({
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",  # so CUDA numbers GPUs as NVML does
        "CUDA_VISIBLE_DEVICES": ",".join(map(str, record.gpus)),
        "GPUQ_JOB_ID": record.id,
        "GPUQ_ATTEMPT": str(record.attempt),
        "GPUQ_GPU_MEM_MIB": str(record.gpu_mem_mib or 0),
        "GPUQ_PREEMPTIBLE": "1" if spec.preemptible else "0",
        "GPUQ_PREEMPTED": "1" if record.preempted else "0",  # resume from your checkpoint
        "GPUQ_HOST": rt.host,
        "GPUQ_ROOT": str(rt.layout.root),
    })
    if record.restarts:
        env["GPUQ_RESTARTS"] = str(record.restarts)
    return env


@dataclass(frozen=True)
class Launch:
    """One start of a job's command: what is spawned, where, as whom."""
    argv: list[str]
    env: dict[str, str]
    cwd: str
    identity: Identity | None          # the spawned process's user (None: the supervisor's)
    container: ContainerRun | None = None


def build_launch(rt: Runtime, record: Record, spec: JobSpec, identity: Identity | None) -> Launch:
    """The job's command (after its venv/conda/setup prelude), on the host with the worker's
    environment plus the job's variables, or through its container's runtime, whose
    container sees only the job's variables (the host's PATH would hide the image's)."""
    workdir = spec.workdir or str(rt.layout.root)
    inner = command_argv(spec.command, prelude_lines(spec.venv, spec.conda, spec.setup))
    variables = job_variables(rt, record, spec)
    if spec.container is None:
        env = {**inherited_environment(), **variables, **(identity.environment() if identity else {})}
        return Launch(inner, env, workdir, identity)
    if identity is not None:  # the image decides HOME; the owner's name is still theirs
        variables.update(USER=identity.name, LOGNAME=identity.name)
    owner = Owner(identity.uid, identity.gid, tuple(identity.groups)) if identity else \
        Owner(os.getuid(), os.getgid(), tuple(os.getgroups()))
    run = container_run(spec.container, spec.container.runtime or rt.container_runtime, inner, variables, workdir,
                        record.gpus, owner, os.geteuid() == 0,
                        container_name(record.id, record.attempt, record.restarts),
                        record.cpu_cores, record.mem_limit_mib)
    client = identity if run.client_as_owner else None
    env = {**inherited_environment(), **run.env, **(client.environment() if client else {})}
    return Launch(run.argv, env, workdir, client, run)


def start_run(rt: Runtime, record: Record, spec: JobSpec, identity: Identity | None, lock_fd: int,
              log_fd: int, log: Callable[[int, str], None]) -> tuple[int, ContainerControl | None]:
    """Spawn one run of the job (its first, or a service's restart), pinned to its cores;
    for a docker/podman container, also the control that stops and removes it with the job.
    Raises OSError naming what failed."""
    launch = build_launch(rt, record, spec, identity)
    control = None
    if launch.container is not None:
        log(log_fd, f"==> container: {shlex.join(launch.argv)}\n")
        if launch.container.name is not None:  # docker/podman: the container outlives its client
            control = ContainerControl(launch.container, launch.env, lambda text: log(log_fd, f"==> gpuq: {text}\n"),
                                       lambda pid: write_container_pid(rt, record, pid))
    with pinned(record.cpu_cores):
        return spawn_job(launch, log_fd, lock_fd), control


# Dispositions a job must not inherit from its supervisor (ignored signals survive exec).
_JOB_DEFAULT_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ)  # the supervisor's other ignores are handlers


def open_log(path: Path, owner: Identity | None) -> int:
    """The job's log for appending: created 0640 (and, for a root worker, given to the job's
    owner), never through a link, and only a plain file of the owner's when it exists: a name
    planted in logs/ must not make root write into someone else's file."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd, created = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o640), True
    except FileExistsError:
        try:
            fd, created = os.open(path, flags), False
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENXIO):  # a symlink, or a FIFO nobody reads
                raise PermissionError(e.errno, f"log {path.name} is a link or a FIFO, not written through") from None
            raise
    st = os.fstat(fd)
    owner_uid = owner.uid if owner else os.geteuid()
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or (not created and st.st_uid != owner_uid):
        os.close(fd)
        raise PermissionError(errno.EPERM, f"log {path.name} exists and is not a plain file of the job's owner")
    if created:
        os.fchmod(fd, 0o640)  # whatever the umask
        if owner is not None:
            os.fchown(fd, owner.uid, owner.gid)
    return fd


def spawn_job(launch: Launch, log_fd: int, lock_fd: int) -> int:
    """Start the job in its own process group, output to its log, holding the job lock.
    posix_spawn (vfork and exec in C) rather than subprocess: no Python runs in the child,
    which saves a millisecond of copied pages per job. Raises OSError naming what failed.
    A job that must change identity starts through subprocess (posix_spawn cannot)."""
    argv, env, workdir, identity = launch.argv, launch.env, launch.cwd, launch.identity
    if identity is not None:
        return _spawn_as(identity, argv, env, workdir, log_fd, lock_fd)
    try:
        os.chdir(workdir)  # the supervisor's own cwd is never used again: all its paths are absolute
    except OSError as e:
        raise OSError(e.errno, f"{e.strerror} (workdir)", workdir) from None
    os.set_inheritable(lock_fd, True)
    candidates = [argv[0]] if "/" in argv[0] else \
        [os.path.join(d, argv[0]) for d in os.get_exec_path(env)]  # PATH as the job will see it
    error: OSError = FileNotFoundError(2, "No such file or directory", argv[0])
    for path in candidates:
        try:
            return os.posix_spawn(path, argv, env, setpgroup=0, setsigmask=(),
                                  setsigdef=_JOB_DEFAULT_SIGNALS,
                                  file_actions=[(os.POSIX_SPAWN_DUP2, log_fd, 1),
                                                (os.POSIX_SPAWN_DUP2, log_fd, 2)])
        except (FileNotFoundError, NotADirectoryError) as e:
            error = e  # try the next PATH entry, as exec*p does
        except OSError as e:
            error = e
            if e.errno != errno.EACCES:
                break
    raise OSError(error.errno, error.strerror, argv[0])


def _spawn_as(identity: Identity, argv: list[str], env: dict[str, str], workdir: str, log_fd: int,
              lock_fd: int) -> int:
    import subprocess

    try:
        proc = subprocess.Popen(argv, cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=log_fd,
                                stderr=log_fd, pass_fds=(lock_fd,), process_group=0, user=identity.uid,
                                group=identity.gid, extra_groups=list(identity.groups))
    except OSError as e:
        raise OSError(e.errno, e.strerror, e.filename if e.filename else argv[0]) from None
    _SPAWNED[proc.pid] = proc  # reaped by _wait with waitpid; told so there (see forget_spawned)
    return proc.pid


_SPAWNED: dict[int, object] = {}


def forget_spawned(pid: int, status: int) -> None:
    """A job started through subprocess has been reaped by waitpid: tell its Popen."""
    proc = _SPAWNED.pop(pid, None)
    if proc is not None:
        proc.returncode = os.waitstatus_to_exitcode(status)  # type: ignore[attr-defined]
