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

A root worker's docker or rootful podman gets each host path it mounts staged first: opened as
the owner and handed over pinned (run/mounts.py).

A docker or podman container belongs to the runtime's daemon (or conmon), not to the client:
killing the client leaves it running. So a stop also runs `RUNTIME stop --time GRACE`, the
kill at the end of the grace `RUNTIME kill`, and whatever way the job ends, `RUNTIME rm
--force` removes what is left.
"""

from __future__ import annotations

import errno
import hashlib
import math
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Protocol, Sequence

from gpuq.model.environments import DAEMON_RUNTIMES, Container, OptionRefused, allowed_options

PROBE_TIMEOUT_S = 10.0
CONTROL_TIMEOUT_S = 30.0
MAX_LOOKUPS = 30


@dataclass(frozen=True)
class Owner:
    uid: int
    gid: int
    groups: tuple[int, ...] = ()


class Staged(Protocol):
    """What a container run keeps of its staged mounts: the means to undo them."""

    def release(self) -> None: ...


@dataclass(frozen=True)
class ContainerRun:
    runtime: str
    argv: list[str]
    env: dict[str, str]  # for the client's environment (the values of -e NAME, APPTAINERENV_*)
    name: str | None  # docker/podman: the container's name, for stop and rm
    client_as_owner: bool  # the client itself runs as the job's owner
    volumes: tuple[int, ...] = ()  # argv indices of the host paths' --volume SRC:DST[:MODE]
    staged: Staged | None = None  # the private binds its mounts were handed over by (run/mounts.py)


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
