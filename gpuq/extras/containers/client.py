"""A job inside a container: the runtime's command line, the container's stop and removal
with the job, its processes (whose GPU memory is the job's), and which runtimes a host has.

The client (docker, podman, apptainer) is the job's own process: the root part starts it as
the job's owner (host/privsep.py), by the absolute path the admin chose (config
container_clients; by default the one on the worker's PATH, never on the job's), with the
clean environment a job starts from. A spec's `env` and gpuq's variables reach the job inside
the container only: docker and podman read them from an env file on the client's stdin (a
file the job's process makes as its owner), apptainer from APPTAINERENV_* variables, which
tell the client nothing about itself.

`container_run` is pure: the same inputs give the same command line (tests keep them as
golden files). What each runtime gets:
- docker: `run --rm --init --name gpuq-<id>-<attempt>-<tag>`, `--gpus '"device=0,2"'`, `--user
  uid:gid` (+ `--group-add`), no new privileges and (for a job not root's) no capabilities,
  the workdir mounted at the same path and used as the working directory, the job's cores
  (`--cpuset-cpus`) and RAM limit (`--memory`), `--env-file /dev/stdin`. Its daemon is root's:
  in a team queue docker runs only where the admin says so (config allow_docker), knowing
  that members who may use it can become root on the box.
- podman: the same, but the GPUs by CDI (`--device nvidia.com/gpu=N`); a client that is not
  root (rootless podman: a member's) keeps the caller's uid instead (`--userns=keep-id`).
- apptainer: `exec --cleanenv [--nv]`, the workdir bound, the variables as APPTAINERENV_*;
  `--nv` binds every GPU, so CUDA_VISIBLE_DEVICES (host numbering) names the job's. Its
  processes stay in the job's process tree, so stopping the job stops them.
Inside docker and podman only the job's GPUs exist, numbered from 0: CUDA_VISIBLE_DEVICES
is `0,...,n-1` there.

The spec's options (already an allow-list, environments.allowed_options) come first and
gpuq's own flags after them, so that for a flag given twice gpuq's value is the one used.

A docker or podman container belongs to the runtime's daemon (or conmon), not to the client:
killing the client may leave it running. So a stop also runs `CLIENT stop --time GRACE`, the
kill at the end of the grace `CLIENT kill`, and whatever way the job ends, `CLIENT rm --force`
removes what is left: each run as the job's owner, like the client itself.
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
from typing import Callable, Mapping, Sequence

from gpuq.extras.containers.spec import DAEMON_RUNTIMES, RUNTIMES, Container, OptionRefused, allowed_options
from gpuq.run.launch import OwnerCommands

PROBE_TIMEOUT_S = 10.0
CONTROL_TIMEOUT_S = 30.0
MAX_LOOKUPS = 30
DOCKER_REFUSED = (
    "docker's daemon is root, so members who may run docker jobs can become root on this box: "
    "a team queue runs them only where config allow_docker is true (gpuq/extras/containers/README.md)"
)
ENV_FILE = "/dev/stdin"  # docker's and podman's --env-file: the job's variables, on the client's stdin


@dataclass(frozen=True)
class Owner:
    uid: int
    gid: int
    groups: tuple[int, ...] = ()


@dataclass(frozen=True)
class ContainerRun:
    runtime: str
    argv: list[str]  # argv[0]: the client, by its absolute path
    env: dict[str, str]  # the client's environment beyond its clean start (APPTAINERENV_*)
    stdin: str | None  # docker/podman: the job's variables, as the env file the client reads
    name: str | None  # docker/podman: the container's name, for stop and rm
    volumes: tuple[int, ...] = ()  # argv indices of the host paths' --volume SRC:DST[:MODE]


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
    client: str,
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
    `client`: the runtime's client, by its absolute path; `job_vars`: what the job must see
    (its env, gpuq's variables), CUDA_VISIBLE_DEVICES as on the host; `inner`: the command to
    run inside. Raises PermissionError for an option the runtime refuses, ValueError for a
    variable an env file cannot carry."""
    variables = {**job_vars, "CUDA_VISIBLE_DEVICES": inside_visible_devices(runtime, gpus)}
    try:  # again, for this host's runtime: a spec without one was checked against them all
        options = list(allowed_options(container.options, runtime))
    except OptionRefused as e:
        raise PermissionError(
            errno.EPERM, f"container option not allowed for {runtime}", f"{e.problem}. Fix: {e.fix}"
        ) from None
    if runtime == "apptainer":
        argv = [client, "exec", *options, "--cleanenv"] + (["--nv"] if gpus else [])
        argv += ["--bind", workdir, "--pwd", workdir]
        for mount in container.mounts:
            argv += ["--bind", mount]
        argv += [container.image, *inner]
        return ContainerRun(runtime, argv, {f"APPTAINERENV_{k}": v for k, v in variables.items()}, None, None)
    argv = [client, "run", *options, "--rm", "--init", "--name", name, "--label", "gpuq=1"]
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
    argv += ["--env-file", ENV_FILE, container.image, *inner]
    return ContainerRun(runtime, argv, {}, env_file(variables), name, tuple(volumes))


def env_file(variables: Mapping[str, str]) -> str:
    """The job's variables as docker's and podman's --env-file reads them: NAME=VALUE a line.
    Raises ValueError for a value such a file cannot carry (a newline ends a line there)."""
    lines = []
    for key in sorted(variables):
        if "\n" in variables[key] or "\r" in variables[key]:
            raise ValueError(
                f"env {key}: its value holds a line break, which docker's and podman's env files "
                "cannot carry. Fix: pass it another way (a file the job reads)"
            )
        lines.append(f"{key}={variables[key]}\n")
    return "".join(lines)


class ContainerControl:
    """The supervisor's hold on a docker/podman container (a run.launch.Companion): stop it
    with the job, kill it at the end of the grace, remove what is left, and find its main
    process (whose descendants' GPU memory is the job's: `tick`). Each command runs as the
    job's owner (`commands`), bounded; none raises."""

    def __init__(
        self, run: ContainerRun, commands: OwnerCommands, note: Callable[[str], None], found: Callable[[int], None]
    ) -> None:
        self.run, self.commands, self.note, self.found = run, commands, note, found
        self.client = run.argv[0]
        self.stopper: object | None = None
        self.pid: int | None = None
        self.lookups = 0
        self.next_lookup = time.monotonic() + 0.3

    def _call(self, *args: str, timeout: float = CONTROL_TIMEOUT_S) -> str | None:
        status, out = self.commands.run([self.client, *args], timeout)
        return out if status == 0 else None

    def stop(self, grace_s: float) -> None:
        """SIGTERM to the container's processes, SIGKILL after the grace (by the runtime),
        without waiting: the supervisor goes on watching the client."""
        seconds = str(max(1, math.ceil(grace_s)))
        self.note(f"stopping container {self.run.name} ({self.run.runtime} stop --time {seconds})")
        try:
            self.stopper = self.commands.start([self.client, "stop", "--time", seconds, self.run.name or ""])
        except Exception as e:  # refused, or the root part is gone: the client's own stop still comes
            self.note(f"cannot run {self.run.runtime} stop: {e}")

    def kill(self) -> None:
        self._call("kill", self.run.name or "", timeout=10)

    def remove(self) -> None:
        """After the client has exited, however: the container must not outlive the job."""
        if self._call("rm", "--force", self.run.name or "") is None and self.lookup_pid() is not None:
            self.note(f"could not remove container {self.run.name}: see `{self.run.runtime} ps`")
        if self.stopper is not None:
            close = getattr(self.stopper, "close", None)
            if close is not None:
                close()
            self.stopper = None

    def lookup_pid(self) -> int | None:
        out = self._call("inspect", "--format", "{{.State.Pid}}", self.run.name or "", timeout=10)
        try:
            pid = int((out or "").strip())
        except ValueError:
            return None
        return pid if pid > 0 else None

    @property
    def due_at(self) -> float:
        """When to look for the container's main process next (inf: found, or given up)."""
        return self.next_lookup if self.pid is None and self.lookups < MAX_LOOKUPS else math.inf

    def tick(self, now: float) -> None:
        """Look for the container's main process, and report it to `found` once it runs;
        tried at growing intervals meanwhile (an image being pulled), about two minutes in all."""
        self.lookups += 1
        self.pid = self.lookup_pid()
        self.next_lookup = now + min(5.0, 0.3 * 2**self.lookups)
        if self.pid is not None:
            self.found(self.pid)


def remove_leftover(
    spec_json: dict, name: str, clients: Mapping[str, str], default_runtime: str, commands: OwnerCommands | None
) -> bool:
    """The docker/podman container of an attempt whose supervisor died without removing it
    (killed, or its host's power cut): remove it (as the job's owner), so that it holds no GPU
    for nobody. Returns whether one was removed."""
    container = Container.from_json(spec_json.get("container"))
    runtime = (container.runtime or default_runtime) if container else None
    if runtime not in DAEMON_RUNTIMES or commands is None or runtime not in clients:
        return False
    try:
        status, _ = commands.run([clients[runtime], "rm", "--force", name], CONTROL_TIMEOUT_S)
    except Exception:
        return False
    return status == 0


def client_paths(configured: Mapping[str, str]) -> dict[str, str]:
    """Each runtime's client by its absolute path: as config container_clients names it, else
    as found on the worker's own PATH (cron's, the admin's: never a job's)."""
    found = {}
    for name in RUNTIMES:
        path = configured.get(name) or shutil.which(name)
        if path:
            found[name] = os.path.abspath(path)
    return found


class RuntimeProbe:
    """A worker's view of its host's runtimes, probed again every PROBE_EVERY_S: a daemon may
    be started or stopped while the worker runs. `refused`: runtimes this queue does not run,
    with why (docker in a team queue without allow_docker). `env`: the clients' environment
    (probe_runtimes)."""

    PROBE_EVERY_S = 300.0

    def __init__(
        self,
        clients: Mapping[str, str] | None = None,
        refused: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.clients = dict(client_paths({}) if clients is None else clients)
        self.refused = dict(refused or {})
        self.env = None if env is None else dict(env)
        self.found: dict[str, str] = {}
        self.problems: dict[str, str] = {}
        self.at = -math.inf

    def refresh(self, now: float) -> None:
        if now - self.at >= self.PROBE_EVERY_S:
            self.found, self.problems = probe_runtimes(self.clients, self.env)
            for name, why in self.refused.items():
                if name in self.found:
                    del self.found[name]
                    self.problems[name] = why
            self.at = now


def probe_runtimes(
    clients: Mapping[str, str] | None = None, env: Mapping[str, str] | None = None
) -> tuple[dict[str, str], dict[str, str]]:
    """The container runtimes this host can use now, name -> version, and those installed
    but not usable, name -> why (a docker client whose daemon does not answer). `env`: what
    the clients run with (a queue account's worker: a clean start and the admin's
    container_env, as its jobs' clients get); None: this process's own."""
    clients = client_paths({}) if clients is None else clients
    commands = {
        # Asking docker's daemon needs its socket, root's (or its group's: root in all but
        # name): only root's own worker asks it. A queue account's asks the client alone; a
        # job whose owner cannot reach the daemon says why in its log.
        "docker": ["version", "--format", "{{.Server.Version}}"] if os.geteuid() == 0 else ["--version"],
        "podman": ["--version"],  # the client alone: rootless storage is each owner's, not ours
        "apptainer": ["--version"],
    }
    found: dict[str, str] = {}
    problems: dict[str, str] = {}
    for name, args in commands.items():
        if name not in clients:
            continue
        argv = [clients[name], *args]
        try:
            done = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=PROBE_TIMEOUT_S,
                env={**(os.environ if env is None else env), "LC_ALL": "C"},
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            problems[name] = f"{' '.join(argv)}: {e}"
            continue
        version = _version_in(done.stdout)
        if done.returncode == 0 and version:
            found[name] = version
        else:
            lines = (done.stderr or done.stdout).strip().splitlines()
            problems[name] = lines[-1][:200] if lines else f"{' '.join(argv)} exited {done.returncode}"
    return found, problems


def _version_in(output: str) -> str | None:
    """The version a client printed: the whole output (`--format` asked for it alone), or the
    word after "version" ("Docker version 24.0.7, build afdd53b", "podman version 4.3.1")."""
    words = output.replace(",", " ").split()
    if "version" in (lowered := [w.lower() for w in words]) and lowered.index("version") + 1 < len(words):
        return words[lowered.index("version") + 1]
    return words[-1] if words else None
