"""The software a job runs in: its container, its virtualenv or conda environment, and its
setup lines. Parsing of those spec fields (with messages that name the fix), and the shell
prelude that activates them before the command.

The prelude is plain /bin/sh, so it runs the same on the host and inside any image. It is
added only when a spec asks for it: every other job starts exactly as before.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from typing import Any, Callable, Sequence

RUNTIMES = ("docker", "podman", "apptainer")
DAEMON_RUNTIMES = ("docker", "podman")  # root's daemon (or rootful podman) makes the container
CONTAINER_KEYS = ("image", "runtime", "mounts", "options")
MAX_MOUNTS = 32
MAX_OPTIONS = 64
_CONDA_NAME = re.compile(r"^[A-Za-z0-9_.+-]{1,100}$")


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


ErrorFactory = Callable[[str, str, str], Exception]  # (field, problem, fix) -> SpecError


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
# removal, limits, env, mounts, workdir). Each option below was judged so (docs/containers.md,
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
    allowed = f"gpuq allows only {allowed_options_text(runtime)} (docs/containers.md)"
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


def parse_venv(value: Any, fail: ErrorFactory) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.startswith("/") or any(c in value for c in "\x00\n"):
        raise fail(
            "venv",
            f"{value!r} is not an absolute path",
            "give the virtualenv's directory, "
            "e.g. `venv: /shared/envs/proj` (made with `python -m venv /shared/envs/proj`)",
        )
    return value.rstrip("/") or "/"


def parse_conda(value: Any, fail: ErrorFactory) -> str | None:
    if value is None:
        return None
    if isinstance(value, str) and (
        _CONDA_NAME.match(value) or (value.startswith("/") and "\x00" not in value and "\n" not in value)
    ):
        return value
    raise fail(
        "conda",
        f"{value!r} is not a conda environment",
        "give its name (`conda: torch-2.3`) or its full path (`conda: /opt/conda/envs/torch`)",
    )


def parse_setup(value: Any, fail: ErrorFactory) -> tuple[str, ...]:
    if value is None:
        return ()
    lines = [value] if isinstance(value, str) else value
    if not isinstance(lines, list) or not lines or not all(isinstance(s, str) and s.strip() for s in lines):
        raise fail(
            "setup",
            "must be a shell line or a list of shell lines",
            "e.g. `setup: [export HF_HOME=/scratch/hf, ./fetch_data.sh]`",
        )
    if any("\x00" in s for s in lines):
        raise fail("setup", "contains a NUL byte", "remove it")
    return tuple(lines)


def prelude_lines(venv: str | None, conda: str | None, setup: tuple[str, ...]) -> list[str]:
    """Shell lines that activate the environment and run the setup, each failure ending the
    job with a line in its log that says what failed (exit 1, or the setup line's status)."""
    if not (venv or conda or setup):
        return []
    lines = ['_gpuq_fail() { printf \'==> gpuq: %s\\n\' "$2" >&2; exit "$1"; }']
    if venv:
        activate = shlex.quote(f"{venv}/bin/activate")
        missing = shlex.quote(f"venv {venv}: no bin/activate (make it with: python -m venv {venv})")
        lines += [
            f"[ -r {activate} ] || _gpuq_fail 1 {missing}",
            f". {activate} || _gpuq_fail 1 {shlex.quote(f'venv {venv}: activation failed')}",
        ]
    if conda:
        name = shlex.quote(conda)
        lines += [
            '_gpuq_conda="${CONDA_EXE:-$(command -v conda)}"',
            '[ -n "$_gpuq_conda" ] || _gpuq_fail 1 "conda: not found (set CONDA_EXE or put conda on PATH)"',
            f'_gpuq_hook="$("$_gpuq_conda" shell.posix activate {name})" || '
            f"_gpuq_fail 1 {shlex.quote(f'conda environment {conda} could not be activated')}",
            f'eval "$_gpuq_hook" || _gpuq_fail 1 {shlex.quote(f"conda environment {conda}: activation failed")}',
            "unset _gpuq_conda _gpuq_hook",
        ]
    for n, line in enumerate(setup, 1):
        what = shlex.quote(f"setup line {n} failed: {line.splitlines()[0][:80]}")
        lines += [f"{{ {line}\n}} || _gpuq_fail $? {what}"]
    return lines


def command_argv(command: str | tuple[str, ...], prelude: list[str]) -> list[str]:
    """The argv that runs the command after the prelude: the command itself when there is
    none, else one /bin/sh script (a list command is exec'd with its arguments unquoted)."""
    if not prelude:
        return ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
    if isinstance(command, str):
        return ["/bin/sh", "-c", "\n".join([*prelude, command])]
    return ["/bin/sh", "-c", "\n".join([*prelude, 'exec "$@"']), "gpuq-job", *command]
