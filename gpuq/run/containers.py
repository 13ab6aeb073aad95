"""A job inside a container: the runtime's command line, the container's stop and removal
with the job, its processes (whose GPU memory is the job's), and which runtimes a host has.

`container_run` is pure: the same inputs give the same command line (tests keep them as
golden files). What each runtime gets:
- docker: `run --rm --init --name gpuq-<id>-<attempt>-<tag>`, `--gpus '"device=0,2"'`, `--user
  uid:gid` (+ `--group-add`), no new privileges and (for a job not root's) no capabilities,
  the workdir mounted at the same path and used as the working
  directory, the job's cores (`--cpuset-cpus`) and RAM limit (`--memory`), and each job
  variable as `-e NAME`, its value taken from the client's environment (values never appear
  on a command line, where `ps` would show them). The client runs as the worker's user.
- podman: the same, but the GPUs by CDI (`--device nvidia.com/gpu=N`); a client that is not
  root (rootless podman) keeps the caller's uid instead (`--userns=keep-id`).
- apptainer: `exec --cleanenv [--nv]`, the workdir bound, the variables as APPTAINERENV_*;
  `--nv` binds every GPU, so CUDA_VISIBLE_DEVICES (host numbering) names the job's. The
  client runs as the job's owner (apptainer runs containers as its caller) and its
  processes stay in the job's process tree, so stopping the job stops them.
Inside docker and podman only the job's GPUs exist, numbered from 0: CUDA_VISIBLE_DEVICES
is `0,...,n-1` there.

The spec's options (already an allow-list, environments.allowed_options) come first and
gpuq's own flags after them, so that for a flag given twice gpuq's value is the one used.

A root worker runs docker and rootful podman on the owner's behalf, and the runtime (root)
resolves each host path it mounts. So each such path (the workdir, the spec's mounts) is
first opened as the owner, refused when the owner cannot read it, and bind-mounted at a
private path of the worker's that the runtime gets instead (`stage_mounts`): the runtime
mounts what the owner could read when gpuq looked, whatever a symlink or a rename does to
the path afterwards. The bind is undone when the container is removed.

A docker or podman container belongs to the runtime's daemon (or conmon), not to the client:
killing the client leaves it running. So a stop also runs `RUNTIME stop --time GRACE`, the
kill at the end of the grace `RUNTIME kill`, and whatever way the job ends, `RUNTIME rm
--force` removes what is left.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import functools
import hashlib
import json
import math
import os
import shutil
import signal
import socket
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from gpuq.host.owners import Identity
from gpuq.model.environments import DAEMON_RUNTIMES, Container, OptionRefused, allowed_options

PROBE_TIMEOUT_S = 10.0
OPEN_AS_OWNER_TIMEOUT_S = 30.0  # a mount source on a hung file system must not hang the supervisor
MOUNTS_DIR = "mounts"  # in the worker's local_dir: the staged mount sources, per job
CONTROL_TIMEOUT_S = 30.0
MAX_LOOKUPS = 30


@dataclass(frozen=True)
class Owner:
    uid: int
    gid: int
    groups: tuple[int, ...] = ()


@dataclass(frozen=True)
class ContainerRun:
    runtime: str
    argv: list[str]
    env: dict[str, str]  # for the client's environment (the values of -e NAME, APPTAINERENV_*)
    name: str | None  # docker/podman: the container's name, for stop and rm
    client_as_owner: bool  # the client itself runs as the job's owner
    volumes: tuple[int, ...] = ()  # argv indices of the host paths' --volume SRC:DST[:MODE]
    staged: "StagedMounts | None" = None  # see stage_mounts


def container_name(job_id: str, attempt: int, claim: str | None = None) -> str:
    """`gpuq-<id>-<attempt>-<tag>`: the tag, from the attempt's claim (which names its root's
    host, boot, worker and a nonce), keeps two queue roots on one box, or one job id reused,
    from taking (or removing) each other's container. A service's restarts use the same
    name: the supervisor removes each run's container before the next (a container it could
    not remove still holds the GPU, and the next run's name clash says so), and a worker
    cleaning up after a dead supervisor needs no restart count, which a full disk can keep
    from reaching the record."""
    tag = f"-{hashlib.sha256(claim.encode()).hexdigest()[:8]}" if claim else ""
    return f"gpuq-{job_id}-{attempt}{tag}"


def inside_visible_devices(runtime: str, gpus: Sequence[int]) -> str:
    """CUDA_VISIBLE_DEVICES as the job sees it inside the container."""
    if runtime in DAEMON_RUNTIMES:
        return ",".join(str(i) for i in range(len(gpus)))
    return ",".join(map(str, gpus))


def container_run(
    container: Container,
    runtime: str,
    inner: list[str],
    job_vars: Mapping[str, str],
    workdir: str,
    gpus: Sequence[int],
    owner: Owner,
    client_is_root: bool,
    name: str,
    cpu_cores: Sequence[int] = (),
    mem_mib: int | None = None,
) -> ContainerRun:
    """The client's command line and environment for one run of a job in `container`.
    `job_vars`: what the job must see (its env, gpuq's variables), CUDA_VISIBLE_DEVICES as
    on the host; `inner`: the command to run inside."""
    variables = {**job_vars, "CUDA_VISIBLE_DEVICES": inside_visible_devices(runtime, gpus)}
    try:  # again, for this host's runtime: a spec without one was checked against them all
        options = list(allowed_options(container.options, runtime))
    except OptionRefused as e:
        raise PermissionError(
            errno.EPERM, f"container option not allowed for {runtime}", f"{e.problem}. Fix: {e.fix}"
        ) from None
    if runtime == "apptainer":
        argv = ["apptainer", "exec", *options, "--cleanenv"] + (["--nv"] if gpus else [])
        argv += ["--bind", workdir, "--pwd", workdir]
        for mount in container.mounts:
            argv += ["--bind", mount]
        argv += [container.image, *inner]
        return ContainerRun(runtime, argv, {f"APPTAINERENV_{k}": v for k, v in variables.items()}, None, True)
    argv = [runtime, "run", *options, "--rm", "--init", "--name", name, "--label", "gpuq=1"]
    if gpus:
        devices = ",".join(map(str, gpus))
        argv += (
            ["--gpus", f'"device={devices}"']
            if runtime == "docker"
            else [a for i in gpus for a in ("--device", f"nvidia.com/gpu={i}")]
        )
    if runtime == "podman" and not client_is_root:
        argv += ["--userns=keep-id", "--group-add", "keep-groups"]  # rootless: stay the caller
    else:
        argv += ["--user", f"{owner.uid}:{owner.gid}"]
        for group in owner.groups:
            if group != owner.gid:
                argv += ["--group-add", str(group)]
    # No setuid binary of the image may make the job root inside (where the mounts are the
    # host's files), and a job not root's keeps no capability: docker's privileges are root's.
    argv += ["--security-opt", "no-new-privileges"] + (["--cap-drop", "ALL"] if owner.uid != 0 else [])
    volumes = []
    for mount in (f"{workdir}:{workdir}", *container.mounts):
        volumes.append(len(argv) + 1)
        argv += ["--volume", mount if ":" in mount else f"{mount}:{mount}"]
        if len(volumes) == 1:
            argv += ["--workdir", workdir]
    if cpu_cores:
        argv += ["--cpuset-cpus", ",".join(map(str, cpu_cores))]
    if mem_mib:
        argv += ["--memory", f"{mem_mib}m"]
    for key in sorted(variables):
        argv += ["--env", key]
    argv += [container.image, *inner]
    return ContainerRun(runtime, argv, dict(variables), name, False, tuple(volumes))


class ContainerControl:
    """The supervisor's hold on a docker/podman container: stop it with the job, kill it at
    the end of the grace, remove what is left, and find its main process (whose descendants'
    GPU memory is the job's). Every call is bounded; none raises."""

    def __init__(
        self, run: ContainerRun, env: Mapping[str, str], note: Callable[[str], None], found: Callable[[int], None]
    ) -> None:
        self.run, self.env, self.note, self.found = run, dict(env), note, found
        self.stopper: subprocess.Popen | None = None
        self.pid: int | None = None
        self.lookups = 0
        self.next_lookup = time.monotonic() + 0.3

    def _call(self, *args: str, timeout: float = CONTROL_TIMEOUT_S) -> str | None:
        try:
            done = subprocess.run(
                [self.run.runtime, *args],
                env=self.env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=timeout,
                text=True,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout if done.returncode == 0 else None

    def stop(self, grace_s: float) -> None:
        """SIGTERM to the container's processes, SIGKILL after the grace (by the runtime),
        without waiting: the supervisor goes on watching the client."""
        seconds = str(max(1, math.ceil(grace_s)))
        self.note(f"stopping container {self.run.name} ({self.run.runtime} stop --time {seconds})")
        try:
            self.stopper = subprocess.Popen(
                [self.run.runtime, "stop", "--time", seconds, self.run.name or ""],
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        except OSError as e:
            self.note(f"cannot run {self.run.runtime} stop: {e}")

    def kill(self) -> None:
        self._call("kill", self.run.name or "", timeout=10)

    def remove(self) -> None:
        """After the client has exited, however: the container must not outlive the job."""
        if self._call("rm", "--force", self.run.name or "") is None and self.lookup_pid() is not None:
            self.note(f"could not remove container {self.run.name}: see `{self.run.runtime} ps`")
        if self.run.staged is not None:  # a container that is left keeps its own copy of the mounts
            self.run.staged.release()
        if self.stopper is not None:
            try:
                self.stopper.wait(timeout=CONTROL_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.stopper.kill()

    def lookup_pid(self) -> int | None:
        out = self._call("inspect", "--format", "{{.State.Pid}}", self.run.name or "", timeout=10)
        try:
            pid = int((out or "").strip())
        except ValueError:
            return None
        return pid if pid > 0 else None

    @property
    def lookup_at(self) -> float:
        """When to look for the container's main process next (inf: found, or given up)."""
        return self.next_lookup if self.pid is None and self.lookups < MAX_LOOKUPS else math.inf

    def try_lookup(self, now: float) -> None:
        """Look for the container's main process, and report it to `found` once it runs;
        tried at growing intervals meanwhile (an image being pulled), about two minutes in all."""
        self.lookups += 1
        self.pid = self.lookup_pid()
        self.next_lookup = now + min(5.0, 0.3 * 2**self.lookups)
        if self.pid is not None:
            self.found(self.pid)


def remove_leftover(spec_json: dict, name: str, default_runtime: str) -> bool:
    """The docker/podman container of an attempt whose supervisor died without removing it
    (killed, or its host's power cut): remove it, so that it holds no GPU for nobody.
    Returns whether one was removed."""
    container = Container.from_json(spec_json.get("container"))
    runtime = (container.runtime or default_runtime) if container else None
    if runtime not in DAEMON_RUNTIMES:
        return False
    try:
        done = subprocess.run(
            [runtime, "rm", "--force", name], stdin=subprocess.DEVNULL, capture_output=True, timeout=CONTROL_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


class RuntimeProbe:
    """A worker's view of its host's runtimes, probed again every PROBE_EVERY_S: a daemon may
    be started or stopped while the worker runs."""

    PROBE_EVERY_S = 300.0

    def __init__(self) -> None:
        self.found: dict[str, str] = {}
        self.problems: dict[str, str] = {}
        self.at = -math.inf

    def refresh(self, now: float) -> None:
        if now - self.at >= self.PROBE_EVERY_S:
            self.found, self.problems = probe_runtimes()
            self.at = now


def probe_runtimes() -> tuple[dict[str, str], dict[str, str]]:
    """The container runtimes this host can use now, name -> version, and those installed
    but not usable, name -> why (a docker client whose daemon does not answer)."""
    commands = {
        "docker": ["docker", "version", "--format", "{{.Server.Version}}"],
        "podman": ["podman", "version", "--format", "{{.Client.Version}}"],
        "apptainer": ["apptainer", "--version"],
    }
    found: dict[str, str] = {}
    problems: dict[str, str] = {}
    for name, argv in commands.items():
        if shutil.which(name) is None:
            continue
        try:
            done = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=PROBE_TIMEOUT_S,
                env={**os.environ, "LC_ALL": "C"},
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            problems[name] = f"{' '.join(argv)}: {e}"
            continue
        words = done.stdout.split()
        if done.returncode == 0 and words:
            found[name] = words[-1]
        else:
            lines = (done.stderr or done.stdout).strip().splitlines()
            problems[name] = lines[-1][:200] if lines else f"{' '.join(argv)} exited {done.returncode}"
    return found, problems


# --- the host paths a root client mounts: opened as the owner, handed over pinned ------------------

_MS_BIND, _MS_REC, _MNT_DETACH = 0x1000, 0x4000, 2


@dataclass(frozen=True)
class StagedMounts:
    """Private binds (`base/0`, `base/1`, ...) of the paths one container mounts."""

    base: Path

    def release(self) -> None:
        """Undo the binds and remove their mount points. Never a recursive removal: a bind
        that could not be undone keeps its directory (rmdir fails on it), and the owner's files."""
        try:
            names = [n for n in os.listdir(self.base) if n.isdigit()]
        except FileNotFoundError:
            return
        for target in (self.base / n for n in names):
            _libc().umount2(os.fsencode(target), _MNT_DETACH)  # fails harmlessly where nothing is mounted
            for remove in (os.rmdir, os.unlink):  # a directory or a file; a busy one stays
                try:
                    remove(target)
                    break
                except OSError:
                    pass
        try:
            os.rmdir(self.base)
        except OSError:
            pass


def stage_mounts(run: ContainerRun, owner: Identity, local_dir: Path, job_id: str) -> ContainerRun:
    """For a root client running a container on `owner`'s behalf (docker, rootful podman):
    each host path it mounts opened as the owner, then bind-mounted at a private path of the
    worker's that the runtime gets instead. Raises OSError naming a path the owner cannot read
    (or that does not exist: root's runtime would create it). The binds are undone by
    `run.staged.release()` (ContainerControl.remove does it)."""
    if run.client_as_owner or not run.volumes:
        return run
    sources = [run.argv[i].split(":", 1)[0] for i in run.volumes]
    fds = _open_as(owner, sources)
    base = _private_dir(Path(os.path.realpath(local_dir)) / MOUNTS_DIR) / job_id
    StagedMounts(base).release()  # what a killed supervisor of this job left
    argv = list(run.argv)
    try:
        os.mkdir(base, 0o700)
        for n, (index, fd) in enumerate(zip(run.volumes, fds)):
            target = base / str(n)
            if stat.S_ISDIR(os.fstat(fd).st_mode):
                os.mkdir(target, 0o700)
            else:
                os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
            if _libc().mount(f"/proc/self/fd/{fd}".encode(), os.fsencode(target), None, _MS_BIND | _MS_REC, None):
                code = ctypes.get_errno()
                raise OSError(
                    code,
                    f"mount source {sources[n]} cannot be bound for the runtime ({os.strerror(code)}: "
                    "a root worker needs CAP_SYS_ADMIN to hand it over safely)",
                    sources[n],
                )
            argv[index] = f"{target}:{argv[index].split(':', 1)[1]}"
    except BaseException:
        StagedMounts(base).release()
        raise
    finally:
        for fd in fds:
            os.close(fd)
    return dataclasses.replace(run, argv=argv, staged=StagedMounts(base))


def release_leftover_mounts(local_dir: Path, job_id: str) -> None:
    """The private binds of an attempt whose supervisor was killed before it undid them."""
    StagedMounts(Path(os.path.realpath(local_dir)) / MOUNTS_DIR / job_id).release()


def _open_as(owner: Identity, paths: list[str]) -> list[int]:
    """Each path opened (O_PATH) by a child that has become `owner` (groups, gid, uid), and
    checked readable by it; the descriptors come back over a socket. The kernel decides, with
    the owner's whole identity: os.access in a root process would ask about root's real uid."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:  # the child: no Python code of the supervisor's runs here, and it ends in _exit
        status = 1
        try:
            ours.close()
            os.setgroups(list(owner.groups))
            os.setgid(owner.gid)
            os.setuid(owner.uid)
            fds: list[int] = []
            refused: list[object] | None = None
            for path in paths:
                try:
                    fds.append(os.open(path, os.O_PATH | os.O_CLOEXEC))
                except OSError as e:
                    refused = [path, e.errno]
                    break
                if not os.access(f"/proc/self/fd/{fds[-1]}", os.R_OK):  # uid == euid: the owner's answer
                    refused = [path, errno.EACCES]
                    break
            socket.send_fds(theirs, [json.dumps(refused).encode()], [] if refused else fds)
            status = 0
        finally:
            os._exit(status)
    theirs.close()
    try:
        ours.settimeout(OPEN_AS_OWNER_TIMEOUT_S)
        message, fds, _, _ = socket.recv_fds(ours, 65536, len(paths))
    except OSError as e:  # a timeout too: a hung file system
        os.kill(pid, signal.SIGKILL)
        raise OSError(
            errno.ETIMEDOUT,
            f"mount sources {', '.join(paths)} could not be opened as {owner.name} "
            f"within {OPEN_AS_OWNER_TIMEOUT_S:g} s ({e})",
            paths[0],
        ) from None
    finally:
        ours.close()
        os.waitpid(pid, 0)
    if not message:  # the child could not become the owner, or died
        raise OSError(errno.EIO, f"mount sources {', '.join(paths)} could not be checked as {owner.name}", paths[0])
    refusal = json.loads(message)  # the child's [path, errno], or null
    if refusal is None and len(fds) == len(paths):
        return fds
    for fd in fds:
        os.close(fd)
    path, code = refusal if refusal else (paths[0], errno.EIO)
    what = (
        "does not exist"
        if code == errno.ENOENT
        else f"is not readable by {owner.name}"
        if code in (errno.EACCES, errno.EPERM)
        else f"cannot be opened by {owner.name} ({os.strerror(code)})"
    )
    raise OSError(code, f"mount source {path} {what}", path)


def _private_dir(path: Path) -> Path:
    """`path`, a 0700 directory of this (root) process, whose every parent only root can
    change (or is sticky): a path handed to the runtime must keep naming what gpuq put there."""
    path.mkdir(mode=0o700, exist_ok=True)
    for d in [path, *path.parents]:
        st = os.lstat(d)
        if (
            not stat.S_ISDIR(st.st_mode)
            or st.st_uid != os.geteuid()
            or (st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX)
            or (d == path and st.st_mode & 0o077)
        ):
            raise PermissionError(
                errno.EPERM,
                f"{d} can be changed by others, so the job's mounts cannot be "
                "handed to the runtime safely: set local_dir in config.yaml to a directory only "
                "root can change",
                str(d),
            )
    return path


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
    libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    return libc
