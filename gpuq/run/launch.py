"""Starting a job's process: its environment, its identity, its log, and the spawn itself.

Run in the supervisor. A job starts in its own process group with default signal
dispositions, stdout and stderr in its log, and the job lock's descriptor inherited. A root
worker's supervisor touches a user's paths only as that user: it enters the workdir with the
owner's credentials (subprocess would chdir while still root, before switching identity),
and everything else (venv, conda, setup) is reached by the job's own shell.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import os
import pwd
import shlex
import signal
import stat
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from gpuq.host.hostinfo import open_to_append
from gpuq.host.owners import Identity
from gpuq.model.environments import command_argv, prelude_lines
from gpuq.model.record import Record
from gpuq.model.sharing import pinned_mem_limit
from gpuq.model.spec import JobSpec
from gpuq.run.containers import (
    ContainerControl,
    ContainerRun,
    Owner,
    container_name,
    container_run,
)
from gpuq.run.joblocal import Runtime, write_container_pid
from gpuq.run.limits import pinned
from gpuq.run.mounts import stage_mounts

# A job that a root worker runs as its owner starts from this PATH, as a login shell would
# (docs/containers.md, "The job's environment"); a venv, conda or the spec's env adds to it.
JOB_PATH = "/usr/local/bin:/usr/bin:/bin"
_KEPT_FROM_THE_WORKER = ("LANG", "LANGUAGE", "TZ")  # and LC_*: how to print, not secrets


class CannotStart(Exception):
    """Why the attempt cannot start: its log and record say "cannot start: " and this."""


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
    path = spec.env.get("PATH") or base_environment(identity).get("PATH", "")
    where = f"the job's PATH was {path} and it ran in {spec.workdir or 'the queue root'}"
    if exit_code == 127:
        return (
            f"exit 127: the shell found no such command; {where}. Fix: give the command's full path, "
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


def job_identity(rt: Runtime, record: Record, worker_euid: int) -> Identity | None:
    """Whom the job runs as: its record's owner (the uid the worker took from the spec
    file and handed over with the record), or None for the worker's own account. A root
    worker runs a job as root only when the record says uid 0 and allow_root_jobs is on:
    uid 0 is never "as myself" by default. Raises CannotStart."""
    if worker_euid != 0:
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
    gpuq's own variables (docs/containers.md, "The job's environment")."""
    env = dict(spec.env)
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
    if record.mps_pipe and record.gpu_uuids:  # a client of its GPU's MPS daemon (run/mps.py)
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


@dataclass(frozen=True)
class Launch:
    """One start of a job's command: what is spawned, where, as whom."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    identity: Identity | None  # the spawned process's user (None: the supervisor's)
    container: ContainerRun | None = None


def build_launch(rt: Runtime, record: Record, spec: JobSpec, identity: Identity | None) -> Launch:
    """The job's command (after its venv/conda/setup prelude), on the host with the worker's
    environment plus the job's variables, or through its container's runtime, whose
    container sees only the job's variables (the host's PATH would hide the image's)."""
    workdir = spec.workdir or str(rt.layout.root)
    inner = command_argv(spec.command, prelude_lines(spec.venv, spec.conda, spec.setup))
    variables = job_variables(rt, record, spec)
    if spec.container is None:
        env = {**base_environment(identity), **variables, **(identity.environment() if identity else {})}
        return Launch(inner, env, workdir, identity)
    if identity is not None:  # the image decides HOME; the owner's name is still theirs
        variables.update(USER=identity.name, LOGNAME=identity.name)
    owner = (
        Owner(identity.uid, identity.gid, tuple(identity.groups))
        if identity
        else Owner(os.getuid(), os.getgid(), tuple(os.getgroups()))
    )
    run = container_run(
        spec.container,
        spec.container.runtime or rt.container_runtime,
        inner,
        variables,
        workdir,
        record.gpus,
        owner,
        os.geteuid() == 0,
        container_name(record.id, record.attempt, record.claim),
        record.cpu_cores,
        record.mem_limit_mib,
    )
    client = identity if run.client_as_owner else None
    env = {**base_environment(client), **run.env, **(client.environment() if client else {})}
    return Launch(run.argv, env, workdir, client, run)


def start_run(
    rt: Runtime,
    record: Record,
    spec: JobSpec,
    identity: Identity | None,
    lock_fd: int,
    log_fd: int,
    log: Callable[[int, str], None],
) -> tuple[int, ContainerControl | None]:
    """Spawn one run of the job (its first, or a service's restart), pinned to its cores;
    for a docker/podman container, also the control that stops and removes it with the job.
    Raises CannotStart for a workdir the owner cannot enter, OSError naming what else failed."""
    launch = build_launch(rt, record, spec, identity)
    enter_workdir(launch.cwd, identity)  # the job's owner, even where a container's client is root
    control = None
    if (container := launch.container) is not None:
        if identity is not None:  # a root client mounts, on the owner's behalf, only what the owner can read
            try:
                container = stage_mounts(container, identity, rt.local_dir, record.id)
            except OSError as e:
                raise CannotStart(e.strerror) from None
            launch = dataclasses.replace(launch, argv=container.argv, container=container)
        log(log_fd, f"==> container: {shlex.join(launch.argv)}\n")
        if container.name is not None:  # docker/podman: the container outlives its client
            control = ContainerControl(
                container,
                launch.env,
                lambda text: log(log_fd, f"==> gpuq: {text}\n"),
                lambda pid: write_container_pid(rt, record, pid),
            )
    with pinned(record.cpu_cores):
        try:
            return spawn_job(launch, log_fd, lock_fd), control
        except OSError:
            if launch.container is not None and launch.container.staged is not None:
                launch.container.staged.release()
            raise


# Dispositions a job must not inherit from its supervisor (ignored signals survive exec).
_JOB_DEFAULT_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ)  # the supervisor's other ignores are handlers


def open_log(path: Path, owner: Identity | None) -> int:
    """The job's log for appending: created 0640 (and, for a root worker, given to the job's
    owner), never through a link, and only a plain file of the owner's when it exists: a name
    planted in logs/ must not make root write into someone else's file. In a team root
    (logs/ setgid to the team's group) the log keeps that group, so the team reads it (docs/security.md);
    elsewhere its group is the owner's own."""
    fd, created = open_to_append(
        path, 0o640, owner.uid if owner else os.geteuid(), f"log {path.name}", "the job's owner"
    )
    if created and owner is not None:
        team_dir = os.stat(path.parent).st_mode & stat.S_ISGID  # the file was created with its group
        os.fchown(fd, owner.uid, -1 if team_dir else owner.gid)
    return fd


def enter_workdir(workdir: str, identity: Identity | None) -> None:
    """Make `workdir` this process's working directory, which the job inherits, entering it
    with the credentials of the job's owner: a directory they could not reach (under a 0700
    /root, or a teammate's 0750 home) stays unreachable through a root worker.
    Raises CannotStart naming the directory and the user."""
    try:
        with _as_user(identity):
            os.chdir(workdir)  # the supervisor's own paths are all absolute: its cwd is the job's
    except OSError as e:
        if e.errno not in (errno.EACCES, errno.EPERM):
            raise CannotStart(f"{e.strerror} (workdir): {workdir}") from None
        user = identity.name if identity else _user_name(os.geteuid())
        raise CannotStart(f"workdir {workdir} is not accessible to {user} ({e.strerror})") from None


@contextmanager
def _as_user(identity: Identity | None) -> Iterator[None]:
    """Act with `identity`'s effective ids and groups (a root supervisor only), then root's
    again. Signals wait meanwhile: no handler runs as the owner. The real and saved uid stay
    root's, so the owner can neither signal nor trace this process meanwhile."""
    if identity is None:
        yield
        return
    groups, egid = os.getgroups(), os.getegid()
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    try:
        os.setgroups(list(identity.groups))
        os.setegid(identity.gid)
        os.seteuid(identity.uid)
        yield
    finally:
        os.seteuid(0)
        os.setegid(egid)
        os.setgroups(groups)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def spawn_job(launch: Launch, log_fd: int, lock_fd: int) -> int:
    """Start the job in its own process group, output to its log, holding the job lock.
    posix_spawn (vfork and exec in C) rather than subprocess: no Python runs in the child,
    which saves a millisecond of copied pages per job. Raises OSError naming what failed.
    A job that must change identity starts through subprocess (posix_spawn cannot). Either
    way it starts in this process's working directory (enter_workdir)."""
    argv, env, identity = launch.argv, launch.env, launch.identity
    if identity is not None:
        return _spawn_as(identity, argv, env, log_fd, lock_fd)
    os.set_inheritable(lock_fd, True)
    candidates = (
        [argv[0]] if "/" in argv[0] else [os.path.join(d, argv[0]) for d in os.get_exec_path(env)]
    )  # PATH as the job will see it
    error: OSError = FileNotFoundError(2, "No such file or directory", argv[0])
    for path in candidates:
        try:
            return os.posix_spawn(
                path,
                argv,
                env,
                setpgroup=0,
                setsigmask=(),
                setsigdef=_JOB_DEFAULT_SIGNALS,
                file_actions=[(os.POSIX_SPAWN_DUP2, log_fd, 1), (os.POSIX_SPAWN_DUP2, log_fd, 2)],
            )
        except (FileNotFoundError, NotADirectoryError) as e:
            error = e  # try the next PATH entry, as exec*p does
        except OSError as e:
            error = e
            if e.errno != errno.EACCES:
                break
    raise OSError(error.errno, error.strerror, argv[0])


def _spawn_as(identity: Identity, argv: list[str], env: dict[str, str], log_fd: int, lock_fd: int) -> int:
    import subprocess

    try:  # no cwd=: subprocess's child would chdir as root, before it switches identity
        proc = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log_fd,
            stderr=log_fd,
            pass_fds=(lock_fd,),
            process_group=0,
            user=identity.uid,
            group=identity.gid,
            extra_groups=list(identity.groups),
        )
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
