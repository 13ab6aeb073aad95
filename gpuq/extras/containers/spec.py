"""The spec's `container` field: its parsing (with messages that name the fix) and the
allow-list of the runtime options a spec may give. The containers extra's half of the spec
(gpuq/hooks.py SpecField); README.md here is the page.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from gpuq.model.config import RUNTIMES, Config
from gpuq.model.environments import ErrorFactory

DAEMON_RUNTIMES = ("docker", "podman")  # root's daemon (or rootful podman) makes the container
CONTAINER_KEYS = ("image", "runtime", "mounts", "options")
MAX_MOUNTS = 32
MAX_OPTIONS = 64


@dataclass(frozen=True)
class Container:
    image: str
    runtime: str | None = None  # None: config container_runtime
    mounts: tuple[str, ...] = ()  # "SRC:DST[:ro|rw]" or "PATH"
    options: tuple[str, ...] = ()  # allowed runtime options, each one argument: --name or --name=value

    def to_json(self) -> dict[str, Any]:
        return {
            "image": self.image,
            "runtime": self.runtime,
            "mounts": list(self.mounts),
            "options": list(self.options),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any] | None) -> "Container | None":
        if not d:
            return None
        return cls(d["image"], d.get("runtime"), tuple(d.get("mounts", ())), tuple(d.get("options", ())))


def parse_container(value: Any, fail: ErrorFactory) -> Container | None:
    example = "e.g. `container: {image: nvcr.io/nvidia/pytorch:24.05-py3, runtime: docker}`"
    if value is None:
        return None
    if isinstance(value, str):
        value = {"image": value}
    if not isinstance(value, dict):
        raise fail("container", "must be an image name or a mapping", example)
    unknown = sorted(str(k) for k in value if k not in CONTAINER_KEYS)
    if unknown:
        raise fail("container", f"unknown key {unknown[0]!r}", f"use only {', '.join(CONTAINER_KEYS)}")
    image = value.get("image")
    if (
        not isinstance(image, str)
        or not image.strip()
        or image.startswith("-")
        or any(c.isspace() or c == "\x00" for c in image)
    ):
        raise fail(
            "container",
            f"image {image!r} is not an image name",
            "give one word like `image: pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime` "
            "(apptainer: a .sif path or docker://...)",
        )
    runtime = value.get("runtime")
    if runtime is not None and runtime not in RUNTIMES:
        raise fail(
            "container",
            f"runtime {runtime!r} is not one gpuq knows",
            f"use one of {', '.join(RUNTIMES)}, or leave it out for config container_runtime",
        )
    options = value.get("options")
    if options is not None:
        if isinstance(options, str):
            try:
                options = shlex.split(options)
            except ValueError as e:
                raise fail(
                    "container",
                    f"options {options!r} cannot be split into words ({e})",
                    "give a list, e.g. `options: [--shm-size=8g]`",
                ) from None
        if not isinstance(options, list) or not all(isinstance(o, str) for o in options):
            raise fail("container", "options must be a list of strings", "e.g. `options: [--shm-size=8g]`")
        try:
            options = allowed_options(options, runtime)
        except OptionRefused as e:
            raise fail("container", e.problem, e.fix) from None
    return Container(image, runtime, _mounts(value.get("mounts"), fail), tuple(options or ()))


def _mounts(value: Any, fail: ErrorFactory) -> tuple[str, ...]:
    if value is None:
        return ()
    fix = "write `mounts: [/data:/data:ro, /scratch]` (host path:container path[:ro])"
    if not isinstance(value, list) or not all(isinstance(m, str) for m in value):
        raise fail("container", "mounts must be a list of host:container paths", fix)
    if len(value) > MAX_MOUNTS:
        raise fail("container", f"{len(value)} mounts; at most {MAX_MOUNTS}", "mount a common parent directory")
    for mount in value:
        parts = mount.split(":")
        paths, mode = (parts[:2], parts[2:]) if len(parts) > 1 else (parts, [])
        if (
            len(parts) > 3
            or not all(p.startswith("/") for p in paths)
            or mode not in ([], ["ro"], ["rw"])
            or any(c in mount for c in ",\x00\n")
        ):
            raise fail("container", f"mount {mount!r} is not host:container[:ro]", fix)
        if any(
            os.path.normpath(p) != p or p.startswith("//") for p in paths
        ):  # "..", "//", "/x/": one spelling per path
            raise fail(
                "container",
                f"mount {mount!r} has a path that is not in its plain form",
                f"write {':'.join(os.path.normpath(p) for p in paths)}{''.join(':' + m for m in mode)}",
            )
    return tuple(value)


# --- container options: an allow-list -----------------------------------------------------------
# docker's daemon acts with root's privileges for whoever may use its socket, and the client
# runs as the job's owner. So a spec's option may only shape the owner's own container: never
# add privilege or change its user, reach the host or another container, make the client
# read or write a host file, or undo what gpuq sets itself (GPUs, user, name and
# removal, limits, env, mounts, workdir). Each option below was judged so (gpuq/extras/containers/README.md,
# "Options", says why); every other option is refused. Only long forms
# are taken: the runtimes' parser (pflag) reads `-iu0` as `-i -u 0`, and nothing allowed
# needs a short flag. Each option is kept as one argument (`--name=value`), so the runtime
# reads exactly what was checked.

_SIZE = re.compile(r"^[0-9]+(\.[0-9]+)?[kKmMgGtT]?[iI]?[bB]?$")
_ULIMIT = re.compile(r"^(memlock|stack|nofile|core)=(-1|[0-9]{1,19})(:(-1|[0-9]{1,19}))?$")
_HOSTNAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]{0,62}$")
_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}=[^\x00-\x1f\x7f-\x9f]{0,256}$")  # no C0, DEL or C1
_TMPFS_FLAGS = ("rw", "ro", "exec", "noexec", "nosuid", "nodev")
_KERNEL_FILESYSTEMS = ("/proc", "/dev", "/sys")  # a tmpfs over them hides what the runtime set up there


def _tmpfs(value: str) -> bool:
    path, _, flags = value.partition(":")
    return (
        path.startswith("/")
        and path != "/"
        and os.path.normpath(path) == path
        and (path == "/dev/shm" or not any(path == k or path.startswith(k + "/") for k in _KERNEL_FILESYSTEMS))
        and not any(c in path for c in ",\x00\n")
        and all(
            f in _TMPFS_FLAGS
            or (f.startswith("size=") and bool(_SIZE.match(f[5:])))
            or bool(re.fullmatch(r"mode=[0-7]{3,4}", f))
            for f in (flags.split(",") if flags else [])
        )
    )


@dataclass(frozen=True)
class RuntimeOption:
    value: str | None  # what its value is, for messages; None: a switch
    valid: Callable[[str], bool] = lambda v: True
    runtimes: tuple[str, ...] = DAEMON_RUNTIMES


ALLOWED_OPTIONS: dict[str, RuntimeOption] = {
    "--shm-size": RuntimeOption("SIZE", lambda v: bool(_SIZE.match(v))),
    "--ulimit": RuntimeOption("memlock|stack|nofile|core=SOFT[:HARD]", lambda v: bool(_ULIMIT.match(v))),
    "--tmpfs": RuntimeOption("PATH[:size=SIZE,mode=MODE,noexec,...]", _tmpfs),
    "--read-only": RuntimeOption(None),
    "--hostname": RuntimeOption("NAME", lambda v: bool(_HOSTNAME.match(v))),
    "--label": RuntimeOption("KEY=VALUE", lambda v: bool(_LABEL.match(v)) and not v.startswith("gpuq")),
    "--entrypoint": RuntimeOption("PROGRAM", lambda v: not any(c in v for c in "\x00\n")),
    "--pull": RuntimeOption("always|missing|never", lambda v: v in ("always", "missing", "never")),
    "--network": RuntimeOption("none|bridge|host", lambda v: v in ("none", "bridge", "host")),
    "--writable-tmpfs": RuntimeOption(None, runtimes=("apptainer",)),
    "--contain": RuntimeOption(None, runtimes=("apptainer",)),
    "--no-home": RuntimeOption(None, runtimes=("apptainer",)),
}

# What to do instead, for options people reach for (by name, without dashes).
_INSTEAD = {
    **dict.fromkeys(("env", "e", "env-file", "env-host"), "put variables in the spec's `env`"),
    **dict.fromkeys(
        ("volume", "v", "mount", "bind", "B", "volumes-from"),
        "put host paths in `mounts:` (each is checked readable by the job's owner)",
    ),
    **dict.fromkeys(("memory", "m", "cpus", "cpuset-cpus", "c", "memory-swap"), "use the spec's `mem` and `cpus`"),
    **dict.fromkeys(("gpus", "device", "nv", "nvccli", "rocm"), "gpuq gives the container exactly the job's GPUs"),
    **dict.fromkeys(("workdir", "w", "pwd"), "use the spec's `workdir`"),
    **dict.fromkeys(
        ("name", "rm", "detach", "d", "init", "cidfile", "pidfile", "conmon-pidfile"),
        "gpuq names the container, stops it and removes it with the job",
    ),
    "ipc": "use --shm-size=SIZE: it gives the container shared memory of its own (the host's /dev/shm and "
    "IPC would outlive the job)",
}


class OptionRefused(ValueError):
    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(f"{problem}. Fix: {fix}")
        self.problem, self.fix = problem, fix


def allowed_options_text(runtime: str | None = None) -> str:
    """The allowed options, as the fix of a refusal lists them."""

    def listed(names: list[str]) -> str:
        return ", ".join(n if ALLOWED_OPTIONS[n].value is None else f"{n}={ALLOWED_OPTIONS[n].value}" for n in names)

    daemon = [n for n, o in ALLOWED_OPTIONS.items() if "docker" in o.runtimes]
    apptainer = [n for n, o in ALLOWED_OPTIONS.items() if "apptainer" in o.runtimes]
    if runtime == "apptainer":
        return listed(apptainer)
    if runtime in DAEMON_RUNTIMES:
        return listed(daemon)
    return f"docker/podman: {listed(daemon)}; apptainer: {listed(apptainer)}"


def allowed_options(options: Sequence[str], runtime: str | None) -> tuple[str, ...]:
    """The options as the runtime will get them (one argument each), or OptionRefused naming
    the first one refused and the fix. `runtime` None (config decides at the host): an option
    any runtime takes; the host's runtime is checked again when the command line is built."""
    if len(options) > MAX_OPTIONS:
        raise OptionRefused(f"{len(options)} options; at most {MAX_OPTIONS}", "keep the ones the job needs")
    allowed = f"gpuq allows only {allowed_options_text(runtime)} (gpuq/extras/containers/README.md)"
    out: list[str] = []
    i = 0
    while i < len(options):
        item = options[i]
        name, eq, value = item.partition("=")
        if "\x00" in item:
            raise OptionRefused(f"option {item!r} contains a NUL byte", "remove it")
        if not name.startswith("--") or name == "--":
            short = item.startswith("-") and item not in ("-", "--")
            hint = _INSTEAD.get(item[1:2]) if short else None
            raise OptionRefused(
                f"option {item!r} "
                + (
                    "is a short flag, which gpuq does not take (a runtime reads -iu0 as -i -u 0)"
                    if short
                    else "is not an option"
                ),
                (f"{hint}; " if hint else "") + "write each option in its long form, as one "
                f"argument (--name=value); {allowed}",
            )
        option = ALLOWED_OPTIONS.get(name)
        if option is None or (runtime is not None and runtime not in option.runtimes):
            hint = _INSTEAD.get(name[2:])
            why = (
                f"is for {', '.join(option.runtimes)}, not {runtime}"
                if option is not None
                else "is not allowed"
                + (
                    ""
                    if hint
                    else ": it could change whom the container runs as or add "
                    "privilege, join the host or another container, or make the runtime "
                    "(root's) read or write a host file"
                )
            )
            raise OptionRefused(f"option {item!r} {why}", f"{hint or 'remove it'}; {allowed}")
        if option.value is None:
            if eq:
                raise OptionRefused(f"option {item!r} takes no value", f"write {name} alone")
            out.append(name)
        else:
            if not eq:
                if i + 1 == len(options):
                    raise OptionRefused(f"option {item!r} needs a value", f"write {name}={option.value}")
                i += 1
                value = options[i]
            if not option.valid(value):
                raise OptionRefused(
                    f"option {name} value {value!r} is not {option.value}", f"write {name}={option.value}"
                )
            out.append(f"{name}={value}")
        i += 1
    return tuple(out)


def parse_field(value: Any, fail: ErrorFactory) -> dict[str, Any] | None:
    """The spec's `container` as the JSON the core keeps (JobSpec.extras), or None."""
    container = parse_container(value, fail)
    return container.to_json() if container is not None else None


def runtime_of(value: dict[str, Any], config: Config) -> str | None:
    """The runtime a host must offer for a job in this container: the plan's `need`."""
    return value.get("runtime") or config.container_runtime
