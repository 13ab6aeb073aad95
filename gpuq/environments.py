"""The software a job runs in: its container, its virtualenv or conda environment, and its
setup lines. Parsing of those spec fields (with messages that name the fix), and the shell
prelude that activates them before the command.

The prelude is plain /bin/sh, so it runs the same on the host and inside any image. It is
added only when a spec asks for it: every other job starts exactly as before.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Any, Callable

RUNTIMES = ("docker", "podman", "apptainer")
CONTAINER_KEYS = ("image", "runtime", "mounts", "options")

# Runtime options that would undo what gpuq promises about a container: exactly the job's
# GPUs, as the job's owner and with no more privilege than the owner has (a root worker runs
# docker on the owner's behalf: docker's privileges are root's), stopped and removed with the
# job. gpuq sets these itself.
FORBIDDEN_OPTIONS = ("--gpus", "--device", "--device-cgroup-rule", "--privileged", "--cap-add",
                     "--security-opt", "--runtime", "--user", "-u", "--userns", "--group-add", "--name",
                     "--detach", "-d", "--rm", "--cidfile", "--nv", "--nvccli", "--rocm", "--cleanenv")
_CONDA_NAME = re.compile(r"^[A-Za-z0-9_.+-]{1,100}$")


@dataclass(frozen=True)
class Container:
    image: str
    runtime: str | None = None         # None: config container_runtime
    mounts: tuple[str, ...] = ()       # "SRC:DST[:ro|rw]" or "PATH"
    options: tuple[str, ...] = ()      # passed to the runtime before the image

    def to_json(self) -> dict[str, Any]:
        return {"image": self.image, "runtime": self.runtime, "mounts": list(self.mounts),
                "options": list(self.options)}

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
    if not isinstance(image, str) or not image.strip() or image.startswith("-") or any(
            c.isspace() or c == "\x00" for c in image):
        raise fail("container", f"image {image!r} is not an image name",
                   "give one word like `image: pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime` "
                   "(apptainer: a .sif path or docker://...)")
    runtime = value.get("runtime")
    if runtime is not None and runtime not in RUNTIMES:
        raise fail("container", f"runtime {runtime!r} is not one gpuq knows",
                   f"use one of {', '.join(RUNTIMES)}, or leave it out for config container_runtime")
    return Container(image, runtime, _mounts(value.get("mounts"), fail), _options(value.get("options"), fail))


def _mounts(value: Any, fail: ErrorFactory) -> tuple[str, ...]:
    if value is None:
        return ()
    fix = "write `mounts: [/data:/data:ro, /scratch]` (host path:container path[:ro])"
    if not isinstance(value, list) or not all(isinstance(m, str) for m in value):
        raise fail("container", "mounts must be a list of host:container paths", fix)
    for mount in value:
        parts = mount.split(":")
        paths, mode = (parts[:2], parts[2:]) if len(parts) > 1 else (parts, [])
        if len(parts) > 3 or not all(p.startswith("/") for p in paths) or mode not in ([], ["ro"], ["rw"]) \
                or any(c in mount for c in ",\x00\n"):
            raise fail("container", f"mount {mount!r} is not host:container[:ro]", fix)
    return tuple(value)


def _options(value: Any, fail: ErrorFactory) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = shlex.split(value)
    if not isinstance(value, list) or not all(isinstance(o, str) and "\x00" not in o for o in value):
        raise fail("container", "options must be a list of strings", "e.g. `options: [--shm-size=8g]`")
    for option in value:
        if _forbidden(option):
            raise fail("container", f"option {option} is not allowed",
                       "remove it: gpuq itself gives the container exactly the job's GPUs, runs it as the job's "
                       "owner with no added privileges, and names, stops and removes it")
    return tuple(value)


def _forbidden(option: str) -> bool:
    for name in FORBIDDEN_OPTIONS:
        if option == name or option.startswith(name + "="):
            return True
        if len(name) == 2 and option.startswith(name) and not option.startswith("--"):
            return True  # -u1000, -d
    return False


def parse_venv(value: Any, fail: ErrorFactory) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.startswith("/") or any(c in value for c in "\x00\n"):
        raise fail("venv", f"{value!r} is not an absolute path", "give the virtualenv's directory, "
                   "e.g. `venv: /shared/envs/proj` (made with `python -m venv /shared/envs/proj`)")
    return value.rstrip("/") or "/"


def parse_conda(value: Any, fail: ErrorFactory) -> str | None:
    if value is None:
        return None
    if isinstance(value, str) and (_CONDA_NAME.match(value) or (value.startswith("/") and "\x00" not in value
                                                                and "\n" not in value)):
        return value
    raise fail("conda", f"{value!r} is not a conda environment",
               "give its name (`conda: torch-2.3`) or its full path (`conda: /opt/conda/envs/torch`)")


def parse_setup(value: Any, fail: ErrorFactory) -> tuple[str, ...]:
    if value is None:
        return ()
    lines = [value] if isinstance(value, str) else value
    if not isinstance(lines, list) or not lines or not all(isinstance(s, str) and s.strip() for s in lines):
        raise fail("setup", "must be a shell line or a list of shell lines",
                   "e.g. `setup: [export HF_HOME=/scratch/hf, ./fetch_data.sh]`")
    if any("\x00" in s for s in lines):
        raise fail("setup", "contains a NUL byte", "remove it")
    return tuple(lines)


def prelude_lines(venv: str | None, conda: str | None, setup: tuple[str, ...]) -> list[str]:
    """Shell lines that activate the environment and run the setup, each failure ending the
    job with a line in its log that says what failed (exit 1, or the setup line's status)."""
    if not (venv or conda or setup):
        return []
    lines = ["_gpuq_fail() { printf '==> gpuq: %s\\n' \"$2\" >&2; exit \"$1\"; }"]
    if venv:
        activate = shlex.quote(f"{venv}/bin/activate")
        lines += [f"[ -r {activate} ] || _gpuq_fail 1 {shlex.quote(f'venv {venv}: no bin/activate (make it with: python -m venv {venv})')}",
                  f". {activate} || _gpuq_fail 1 {shlex.quote(f'venv {venv}: activation failed')}"]
    if conda:
        name = shlex.quote(conda)
        lines += ['_gpuq_conda="${CONDA_EXE:-$(command -v conda)}"',
                  '[ -n "$_gpuq_conda" ] || _gpuq_fail 1 "conda: not found (set CONDA_EXE or put conda on PATH)"',
                  f'_gpuq_hook="$("$_gpuq_conda" shell.posix activate {name})" || '
                  f"_gpuq_fail 1 {shlex.quote(f'conda environment {conda} could not be activated')}",
                  f'eval "$_gpuq_hook" || _gpuq_fail 1 {shlex.quote(f"conda environment {conda}: activation failed")}',
                  "unset _gpuq_conda _gpuq_hook"]
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
