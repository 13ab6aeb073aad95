"""The containers extra's hooks into a job's life (gpuq/hooks.py): the launch wrapper that
starts a job through its container's runtime client (`wrap`), the removal of the container
an attempt whose supervisor died left running (`recover`), the worker's probe of its host's
runtimes (`offers`).

What runs as root is the core's and unchanged (host/privsep.py): the root part starts the
client the wrapper names, as the job's owner, with the environment and stdin the wrapper
gives, exactly as it starts any job's command.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from gpuq.extras.containers.client import (
    DOCKER_REFUSED,
    ContainerControl,
    ContainerRun,
    Owner,
    RuntimeProbe,
    client_paths,
    container_name,
    container_run,
    remove_leftover,
)
from gpuq.extras.containers.spec import RUNTIMES, Container
from gpuq.model.config import Config
from gpuq.run.launch import JOB_PATH, CannotStart, CompanionTools, Leftover, Start, Wrapped

HOW = "container"  # the word of the job log's line that shows the client's command line


def _settings(settings: Mapping[str, Any]) -> tuple[str, dict[str, str], bool, dict[str, str]]:
    """The worker's config keys this extra reads: container_runtime, container_clients,
    allow_docker, container_env (handed to the supervisor in Runtime.settings)."""
    return (
        settings.get("container_runtime") or "docker",
        dict(settings.get("container_clients") or {}),
        bool(settings.get("allow_docker")),
        dict(settings.get("container_env") or {}),
    )


def wrap(start: Start) -> Wrapped | None:
    """The job's command through its container's runtime client, whose container sees only
    the job's variables (the host's PATH would hide the image's). Raises CannotStart."""
    container = Container.from_json(start.spec.extras.get("container"))
    if container is None:
        return None
    default_runtime, configured, allow_docker, container_env = _settings(start.rt.settings)
    identity = start.identity
    variables = dict(start.variables)
    if identity is not None:  # the image decides HOME; the owner's name is still theirs
        variables.update(USER=identity.name, LOGNAME=identity.name)
    owner = (
        Owner(identity.uid, identity.gid, tuple(identity.groups))
        if identity
        else Owner(os.getuid(), os.getgid(), tuple(os.getgroups()))
    )
    runtime = container.runtime or default_runtime
    # A preview (`gpuq show`) names the admin's clients, else the bare name a worker finds on
    # its PATH, and shows what would run: whether docker may is the worker's to say.
    clients = {r: configured.get(r, r) for r in RUNTIMES} if start.preview else client_paths(configured)
    if not start.preview and runtime == "docker" and identity is not None and os.geteuid() != 0 and not allow_docker:
        raise CannotStart(DOCKER_REFUSED)  # a team queue: the queue's account, jobs as their owners
    client = clients.get(runtime)
    if client is None:
        raise CannotStart(f"no {runtime} client on {start.rt.host} (config container_clients, or the worker's PATH)")
    run = _run(start, container, runtime, client, variables, owner)
    # The client's own environment: a job's clean start, the admin's container_env, and (for
    # apptainer) the job's variables under APPTAINERENV_*, which tell the client nothing.
    env = {**start.base_env, **container_env, **run.env, **(identity.environment() if identity else {})}
    return Wrapped(
        run.argv,
        env,
        HOW,
        runtime,
        _seen(run),
        f"the image's environment, then these ({runtime})",
        run.stdin,
        _companion(run, container_env) if run.name is not None else None,
    )


def _run(
    start: Start, container: Container, runtime: str, client: str, variables: dict[str, str], owner: Owner
) -> ContainerRun:
    record = start.record
    try:
        return container_run(
            container,
            runtime,
            client,
            start.argv,
            variables,
            start.workdir,
            record.gpus,
            owner,
            start.identity is None and os.geteuid() == 0,  # root's own job in root's own queue
            container_name(record.id, record.attempt, record.claim),
            record.cpu_cores,
            record.mem_limit_mib,
        )
    except ValueError as e:
        raise CannotStart(str(e)) from None
    except PermissionError as e:
        raise CannotStart(f"{e.strerror}: {e.filename}") from None


def _seen(run: ContainerRun) -> dict[str, str]:
    """What the job sees inside: docker's and podman's env file, apptainer's APPTAINERENV_*."""
    if run.stdin is not None:
        return dict(line.split("=", 1) for line in run.stdin.splitlines())
    return {k.removeprefix("APPTAINERENV_"): v for k, v in run.env.items()}


def _companion(run: ContainerRun, container_env: dict[str, str]):  # -> Callable[[CompanionTools], Companion]
    """A docker/podman container outlives its client: the supervisor's hold on it."""

    def make(tools: CompanionTools) -> ContainerControl:
        return ContainerControl(run, tools.as_owner(container_env), tools.note, tools.found)

    return make


def recover(left: Leftover) -> str | None:
    """The docker/podman container of an attempt whose supervisor died (killed, or its host's
    power cut), removed as the job's owner so that it holds no GPU for nobody: what was
    removed, or None."""
    record = left.record
    default_runtime, configured, _, container_env = _settings(left.rt.settings)
    name = container_name(record.id, record.attempt, record.claim)
    commands = left.as_owner(container_env) if left.as_owner is not None else None
    if remove_leftover(record.spec, name, client_paths(configured), default_runtime, commands):
        return f"container {name}"
    return None


def offers(config: Config, team: bool) -> RuntimeProbe:
    """A worker's probe of the runtimes its host has. In a team's queue (the queue's account,
    jobs as their owners) docker runs only where config allow_docker says so, and the clients
    are asked as its jobs' clients start (run/launch.py): from a clean environment."""
    return RuntimeProbe(
        client_paths(config.container_clients),
        {"docker": DOCKER_REFUSED} if team and not config.allow_docker else {},
        {**({"PATH": JOB_PATH, "HOME": "/"} if team else os.environ), **config.container_env},
    )
