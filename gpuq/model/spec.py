"""Job specs: the one schema, strict parsing and validation with errors that name the fix.

A spec is YAML. `parse_spec_text` turns bytes into a validated `JobSpec` or raises `SpecError`
(and nothing else) naming the file, the field and the fix.
"""

from __future__ import annotations

import datetime
import difflib
import math
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from gpuq import hooks
from gpuq.model.environments import parse_conda, parse_setup, parse_venv
from gpuq.model.errors import SpecError, kind_of
from gpuq.model.groups import check_array, check_expansion, check_sweep
from gpuq.model.names import ID_RULE, JOB_ID_RE
from gpuq.model.spec_fields import FIELDS
from gpuq.model.strict_yaml import load_yaml
from gpuq.model.units import DURATION_EXAMPLES, SIZE_EXAMPLES, parse_duration_s, parse_size_mib

PRIORITY_CLASSES = ("high", "normal", "low")
# The longest grace an opportunistic job gets: when it yields, the job that needs its GPU
# waits that long (a member's `grace: 1d` held two GPUs for a day). Long enough to write a
# large model's checkpoint. `gpuq submit` and `gpuq edit` refuse more; a spec already in the
# queue, and config grace_s, are held to it (stop_grace_s).
LOW_GRACE_MOST_S = 600.0


def stop_grace_s(grace_s: float | None, preemptible: bool, config_grace_s: float) -> float:
    """How long a stop of a job may take (SIGTERM, then SIGKILL): its spec's grace, else the
    config's; an opportunistic job's at most LOW_GRACE_MOST_S."""
    grace = config_grace_s if grace_s is None else grace_s
    return min(grace, LOW_GRACE_MOST_S) if preemptible else grace


CLASS_RANK = {"high": 0, "normal": 1, "low": 2}


def command_text(command: str | list[str] | tuple[str, ...] | None) -> str:
    """A command as a user would type it: a shell string as is, a list quoted for the shell."""
    return command if isinstance(command, str) else shlex.join(command or [])


def command_shown(command: str | list[str] | tuple[str, ...] | None) -> str:
    """A command for a screen or a log's first lines: as command_text, but a word of several
    lines (a batch script copied at submit, `bash -c TEXT PATH ARG...`: cli/batch_script.py)
    as `<script of N lines>`. Only an abbreviation of what runs, never a claim about it."""
    if isinstance(command, str) or not any("\n" in word for word in command or []):
        return command_text(command)
    return " ".join(
        f"<script of {len(word.splitlines())} lines>" if "\n" in word else shlex.quote(word) for word in command or []
    )


@dataclass(frozen=True)
class JobSpec:
    command: str | tuple[str, ...]
    name: str | None = None
    gpus: int = 1
    gpu_mem_mib: int | None = None  # None: the whole GPU, exclusively
    gpu_compute_pct: int | None = None  # MPS active thread percentage; None: its memory share
    priority_class: str = "normal"
    priority: int = 0
    workdir: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    hosts: tuple[str, ...] = ()
    retries: int | None = None  # None: the config's lost_retries
    preemptible: bool = False  # opportunistic (always true for priority low)
    grace_s: float | None = None  # None: the config's grace_s
    time_limit_s: float | None = None  # None: the config's time_limit
    cpus: int | None = None  # None: the config's cpus
    mem_mib: int | None = None  # None: the config's mem
    after: tuple[str, ...] = ()  # spool/deps.py: start after these succeeded ...
    after_any: tuple[str, ...] = ()  # ... or after these ended, whatever the result
    sweep: tuple[tuple[str, tuple], ...] = ()  # spool/sweeps.py: expanded into member jobs, never run itself
    array: str | None = None  # spool/sweeps.py: `0-9` -> member jobs <id>_<index>, never run itself
    array_limit: int | None = None  # spool/deps.py: at most this many of its array's members run at once
    begin_at: float | None = None  # spool/deps.py: not started before this Unix time (sbatch --begin)
    restart: str = "never"  # sched/restarts.py: a service restarted in place after it ends
    venv: str | None = None  # activated before the command ...
    conda: str | None = None  # ... and this conda environment ...
    setup: tuple[str, ...] = ()  # ... then these shell lines
    # The extras' fields (gpuq/hooks.py SpecField: `container`), by name, as JSON: the core
    # keeps them, and hands them to the extras that give them (the plan's needs, a start's wrapper).
    extras: Mapping[str, Any] = field(default_factory=dict)

    @property
    def exclusive(self) -> bool:
        return self.gpus > 0 and self.gpu_mem_mib is None

    def command_text(self) -> str:
        return command_text(self.command)

    def to_json(self) -> dict[str, Any]:
        return {
            "command": self.command if isinstance(self.command, str) else list(self.command),
            "name": self.name,
            "gpus": self.gpus,
            "gpu_mem_mib": self.gpu_mem_mib,
            "gpu_compute_pct": self.gpu_compute_pct,
            "priority_class": self.priority_class,
            "priority": self.priority,
            "workdir": self.workdir,
            "env": dict(self.env),
            "hosts": list(self.hosts),
            "retries": self.retries,
            "preemptible": self.preemptible,
            "grace_s": self.grace_s,
            "time_limit_s": self.time_limit_s,
            "cpus": self.cpus,
            "mem_mib": self.mem_mib,
            "after": list(self.after),
            "after_any": list(self.after_any),
            "sweep": {k: list(v) for k, v in self.sweep},
            "array": self.array,
            "array_limit": self.array_limit,
            "begin_at": self.begin_at,
            "restart": self.restart,
            "venv": self.venv,
            "conda": self.conda,
            "setup": list(self.setup),
            **self.extras,  # at the top, as the field is written in a spec
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "JobSpec":
        # Called for every pending job by `gpuq status` (10,000 of them): the instance is
        # filled directly, as the frozen dataclass's __init__ (a checked setattr per field)
        # costs several times more. The values are the ones to_json wrote.
        cmd = d["command"]
        spec = object.__new__(cls)
        spec.__dict__.update(
            command=cmd if isinstance(cmd, str) else tuple(cmd),
            name=d["name"],
            gpus=d["gpus"],
            gpu_mem_mib=d["gpu_mem_mib"],
            gpu_compute_pct=d.get("gpu_compute_pct"),
            priority_class=d["priority_class"],
            priority=d["priority"],
            workdir=d["workdir"],
            env=dict(d["env"]),
            hosts=tuple(d["hosts"]),
            retries=d.get("retries"),
            preemptible=d.get("preemptible", False),
            grace_s=d.get("grace_s"),
            time_limit_s=d.get("time_limit_s"),
            cpus=d.get("cpus"),
            mem_mib=d.get("mem_mib"),
            after=tuple(d.get("after", ())),
            after_any=tuple(d.get("after_any", ())),
            sweep=tuple((k, tuple(v)) for k, v in (d.get("sweep") or {}).items()),
            array=d.get("array"),
            array_limit=d.get("array_limit"),
            begin_at=d.get("begin_at"),
            restart=d.get("restart", "never"),
            venv=d.get("venv"),
            conda=d.get("conda"),
            setup=tuple(d.get("setup") or ()),
            extras=extras_in(d),
        )
        return spec

    def to_cache(self) -> dict[str, Any]:
        """to_json without the fields at their defaults: the workers' shared cache of every
        pending spec (read by each `gpuq status`) stays a quarter of the size."""
        return {k: v for k, v in self.to_json().items() if k == "command" or v != _DEFAULTS_JSON.get(k)}

    @classmethod
    def from_cache(cls, d: Mapping[str, Any]) -> "JobSpec":
        """The inverse of to_cache. Only the fields a spec sets are converted (a few of 25):
        `gpuq status` builds 10,000 of these."""
        spec = object.__new__(cls)
        fields = dict(_DEFAULT_FIELDS)
        for key, value in d.items():
            convert = _FROM_CACHE.get(key)
            fields[key] = convert(value) if convert else value
        fields["extras"] = extras_in(d)
        spec.__dict__.update({k: v for k, v in fields.items() if k in _DEFAULT_FIELDS})
        return spec


_DEFAULTS_JSON = JobSpec(command="").to_json()
_DEFAULT_FIELDS = dict(JobSpec(command="").__dict__)
_CORE_KEYS = frozenset(_DEFAULTS_JSON)


def extras_in(d: Mapping[str, Any]) -> dict[str, Any]:
    """The extras' fields of a spec's JSON: what is not the core's (a record from before an
    extra existed says `container: null`, which is none)."""
    return {k: d[k] for k in d.keys() - _CORE_KEYS if d[k] is not None}


_FROM_CACHE: dict[str, Any] = {
    "command": lambda v: v if isinstance(v, str) else tuple(v),
    "env": dict,
    "hosts": tuple,
    "after": tuple,
    "after_any": tuple,
    "setup": tuple,
    "sweep": lambda v: tuple((k, tuple(x)) for k, x in (v or {}).items()),
}


def parse_spec_text(text: bytes, file: str, new: bool = False) -> JobSpec:
    """Bytes of a spec file -> JobSpec, or SpecError naming the file, field and fix (`new`: as
    validate_spec)."""
    return validate_spec(load_yaml(text, file), file, new)


def spec_text_with(text: bytes, changes: Mapping[str, Any], note: str, file: str) -> bytes:
    """A spec's text with the top-level fields in `changes` set (None removes one), headed by
    `note` as a comment: what a retry rule's requeue runs next (run/retry.py). The fields are
    written as YAML writes them, so a hand-written spec loses its comments; the attempt's
    record keeps the text as it was. SpecError where the result is no spec."""
    data = load_yaml(text, file)
    if not isinstance(data, dict):
        raise SpecError(file, "(top level)", "is not a mapping", "write the spec as `key: value` lines")
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    comment = "".join(f"# {line}\n" for line in note.splitlines())
    new = (comment + yaml.safe_dump(data, sort_keys=False, allow_unicode=True)).encode()
    validate_spec(load_yaml(new, file), file)
    return new


def validate_spec(data: Any, file: str, new: bool = False) -> JobSpec:
    """A loaded YAML document -> JobSpec. Every message names the field and the fix. `new`: a
    spec a person writes now (submit, edit), refused what a spec already in the queue is held
    to instead (an opportunistic job's grace over LOW_GRACE_MOST_S)."""
    if not isinstance(data, dict):
        raise SpecError(
            file,
            None,
            "a spec must be a mapping of fields",
            "write lines like `command: python train.py` and `gpus: 1`",
        )
    extras = _extra_fields(data, file)
    priority_class, priority = _priority(data.get("priority", "normal"), file)
    if data.get("gpus") == 0 and data.get("gpu_mem") is not None:
        raise SpecError(
            file, "gpu_mem", "is set for a CPU-only job (gpus: 0)", "remove gpu_mem, or ask for a GPU with `gpus: 1`"
        )
    command = _command(data.get("command"), file)

    def fail(field: str, problem: str, fix: str) -> SpecError:
        return SpecError(file, field, problem, fix)

    typed = command_text(command)  # as the user would type it: what a sweep's names are found in
    sweep = check_sweep(data.get("sweep"), typed, file)
    array = check_array(data.get("array"), data.get("sweep"), file)
    check_expansion(data, typed, sweep, array, file)
    preemptible = _preemptible(data.get("preemptible"), priority_class, file)
    grace_s = _duration(data.get("grace"), "grace", 86400, file)
    if preemptible and grace_s is not None and grace_s > LOW_GRACE_MOST_S and new:
        raise SpecError(
            file,
            "grace",
            f"{data.get('grace')} is longer than an opportunistic job may take to yield "
            f"({LOW_GRACE_MOST_S / 60:g}m): the job that needs its GPU would wait that long",
            f"give `grace: {LOW_GRACE_MOST_S / 60:g}m` or less, or make it an ordinary job",
        )
    if preemptible and grace_s is not None:  # a spec accepted before the bound, or put back: held to it
        grace_s = min(grace_s, LOW_GRACE_MOST_S)
    return JobSpec(
        command=command,
        name=_optional_str(data, "name", file),
        gpus=_gpus(data.get("gpus", 1), file),
        gpu_mem_mib=_gpu_mem(data.get("gpu_mem"), file),
        gpu_compute_pct=_gpu_compute(data, file),
        priority_class=priority_class,
        priority=priority,
        workdir=_workdir(data.get("workdir"), file),
        env=_env(data.get("env"), file),
        hosts=_hosts(data.get("hosts"), file),
        retries=_retries(data.get("retries"), file),
        preemptible=preemptible,
        grace_s=grace_s,
        time_limit_s=_duration(data.get("time_limit"), "time_limit", 365 * 86400, file),
        cpus=_cpus(data.get("cpus"), file),
        mem_mib=_mem(data.get("mem"), file),
        after=_job_ids(data.get("after"), "after", file),
        after_any=_job_ids(data.get("after_any"), "after_any", file),
        sweep=sweep,
        array=array,
        array_limit=_array_limit(data.get("array_limit"), file),
        begin_at=_begin(data.get("begin"), file),
        restart=_restart(data.get("restart"), file),
        venv=parse_venv(data.get("venv"), fail),
        conda=parse_conda(data.get("conda"), fail),
        setup=parse_setup(data.get("setup"), fail),
        extras=extras,
    )


def _array_limit(value: Any, file: str) -> int | None:
    if value is None:
        return None
    if type(value) is not int or value < 1:
        raise SpecError(file, "array_limit", f"must be a whole number of jobs, 1 or more, not {value!r}", "write 2")
    return value


LATEST_BEGIN = 253402300799.0  # 9999-12-31T23:59:59Z


def _begin(value: Any, file: str) -> float | None:
    """`begin:` as an instant: an ISO 8601 time (local where it gives no offset), or a Unix time.
    Relative forms (now+1hour) are the CLI's: a file has no "now" of its own."""
    fix = 'write a time like "2026-12-24T08:00" (quoted), or use `gpuq submit --begin now+1hour`'
    if value is None:
        return None
    if isinstance(value, (datetime.datetime, datetime.date)):  # YAML's own timestamps (not in gpuq's reader)
        value = value.isoformat()
    if isinstance(value, str):
        try:
            at = datetime.datetime.fromisoformat(value.strip()).timestamp()  # naive: local time
        except (ValueError, OverflowError, OSError):
            raise SpecError(file, "begin", f"{value!r} is not a time gpuq reads", fix) from None
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        at = float(value)
    else:
        raise SpecError(file, "begin", f"must be a time, not {kind_of(value)}", fix)
    # Within what every clock and `time.localtime` can say: one file's year 10**9 must not
    # stop every worker's pass (a security review, 2026-12-06).
    if not (math.isfinite(at) and 0 <= at <= LATEST_BEGIN):
        raise SpecError(file, "begin", f"{value!r} is not a time between 1970 and the year 9999", fix)
    return at


def _extra_fields(data: dict, file: str) -> dict[str, Any]:
    """The spec's fields that extras give, each checked by its extra; SpecError for a field
    nobody gives, or one whose extra is not here."""
    known = [*FIELDS, *hooks.registry().spec_fields]
    extras: dict[str, Any] = {}
    for key in sorted(str(k) for k in data if k not in FIELDS):
        if (missing := hooks.missing_field(key)) is not None:
            raise SpecError(file, key, *missing)
        parse = hooks.spec_parser(key)
        if parse is None:
            fields = ", ".join(known)
            near = difflib.get_close_matches(key, known, n=1, cutoff=0.6)  # a typo's field, as verbs suggest theirs
            fix = (
                f"did you mean '{near[0]}'? Else remove it; the fields: {fields}"
                if near
                else f"remove it or use one of: {fields}"
            )
            raise SpecError(file, key, "unknown field", fix)

        def fail(field: str, problem: str, fix: str) -> SpecError:
            return SpecError(file, field, problem, fix)

        if (value := parse(data[key], fail)) is not None:
            extras[key] = value
    return extras


def _command(value: Any, file: str) -> str | tuple[str, ...]:
    if value is None:
        raise SpecError(
            file,
            "command",
            "missing",
            "add `command: python train.py` (a string runs under /bin/sh -c; a list is executed directly)",
        )
    if isinstance(value, str):
        if not value.strip():
            raise SpecError(file, "command", "is empty", "write the command to run")
        if "\x00" in value:
            raise SpecError(file, "command", "contains a NUL byte", "remove it")
        return value
    if isinstance(value, list) and value and all(isinstance(a, str) for a in value):
        if not value[0].strip():
            raise SpecError(file, "command", "first element is empty", "name the program first")
        if any("\x00" in a for a in value):
            raise SpecError(file, "command", "contains a NUL byte", "remove it")
        return tuple(value)
    if isinstance(value, (bool, int, float)):  # `command: true` is YAML's boolean, not /bin/true
        text = str(value).lower() if isinstance(value, bool) else str(value)
        raise SpecError(
            file, "command", f"YAML read this as {kind_of(value)}, not a command", f'quote it: `command: "{text}"`'
        )
    raise SpecError(
        file,
        "command",
        f"must be a string or a list of strings, not {kind_of(value)}",
        "e.g. `command: python train.py` or `command: [python, train.py]`",
    )


def _gpus(value: Any, file: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(
            file,
            "gpus",
            f"must be a whole number, not {kind_of(value)} {value!r}",
            "e.g. `gpus: 1` (0 for a CPU-only job)",
        )
    if value < 0 or value > 64:
        raise SpecError(file, "gpus", f"{value} is out of range", "use 0 to 64 GPUs on one host")
    return value


def _gpu_mem(value: Any, file: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str):
        raise SpecError(file, "gpu_mem", f"{value!r} has no unit", f"write it like {SIZE_EXAMPLES}")
    try:
        mib = parse_size_mib(value)
    except ValueError as e:
        raise SpecError(file, "gpu_mem", str(e).split(";")[0], f"write it like {SIZE_EXAMPLES}") from None
    if mib <= 0 or mib > 64 * 1024 * 1024:
        raise SpecError(file, "gpu_mem", f"{value} is out of range", "give the memory one GPU needs, e.g. 20GiB")
    return mib


def _gpu_compute(data: dict, file: str) -> int | None:
    value = data.get("gpu_compute")
    if value is None:
        return None
    text = value.strip().removesuffix("%").strip() if isinstance(value, str) else value
    # ASCII digits only: str.isdigit() takes '²' too, which int() then refuses.
    pct = int(text) if isinstance(text, str) and re.fullmatch(r"[0-9]{1,3}", text) else text
    if isinstance(pct, bool) or not isinstance(pct, int) or not 1 <= pct <= 100:
        raise SpecError(file, "gpu_compute", f"{value!r} is not a percentage from 1 to 100", "e.g. `gpu_compute: 50%`")
    if data.get("gpus", 1) != 1:
        raise SpecError(
            file,
            "gpu_compute",
            "is for a job of one GPU (an MPS client talks to one GPU's daemon; wider jobs are time-sliced)",
            "remove gpu_compute, or ask for `gpus: 1`",
        )
    if data.get("gpu_mem") is None:
        raise SpecError(
            file,
            "gpu_compute",
            "is set for a job that takes its GPUs whole (no gpu_mem)",
            "give gpu_mem too (a share of a GPU), or remove gpu_compute",
        )
    return pct


def _priority(value: Any, file: str) -> tuple[str, int]:
    if isinstance(value, str) and value in PRIORITY_CLASSES:
        return value, 0
    if isinstance(value, int) and not isinstance(value, bool) and -1000 <= value <= 1000:
        return "normal", value
    raise SpecError(
        file,
        "priority",
        f"{value!r} is not a priority",
        "use high, normal, low, or an integer from -1000 to 1000 (higher runs first)",
    )


def _optional_str(data: dict, key: str, file: str) -> str | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or "\n" in value or len(value) > 200:
        raise SpecError(
            file, key, "must be one line of text (at most 200 characters)", f"e.g. `{key}: {FIELDS[key].example}`"
        )
    return value


def _workdir(value: Any, file: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.startswith("/") or "\x00" in value:
        raise SpecError(file, "workdir", f"{value!r} is not an absolute path", "give a full path like /home/ana/proj")
    return value


def _env(value: Any, file: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SpecError(file, "env", f"must be a mapping, not {kind_of(value)}", "write `env: {NAME: value}`")
    for k, v in value.items():
        if not isinstance(k, str) or not k or "=" in k or "\x00" in k:
            raise SpecError(file, "env", f"{k!r} is not a variable name", "use names like WANDB_MODE")
        if not isinstance(v, str) or "\x00" in v:
            raise SpecError(file, "env", f"value of {k} is {kind_of(v)}, not a string", f'quote it: `{k}: "{v}"`')
    return dict(value)


def _retries(value: Any, file: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 100:
        raise SpecError(
            file,
            "retries",
            f"{value!r} is not a number of re-runs",
            "use a whole number from 0 to 100, e.g. `retries: 0` for a job that must never run twice",
        )
    return value


def _preemptible(value: Any, priority_class: str, file: str) -> bool:
    if value is None:
        return priority_class == "low"
    if not isinstance(value, bool):
        raise SpecError(file, "preemptible", f"{value!r} is not true or false", "write `preemptible: true`")
    if not value and priority_class == "low":
        raise SpecError(
            file,
            "preemptible",
            "is false for a priority low job, which is always opportunistic",
            "remove `preemptible: false`, or use priority normal (or an integer)",
        )
    return value


def _duration(value: Any, field: str, most_s: float, file: str) -> float | None:
    if value is None:
        return None
    try:  # sbatch's 1:30:00 and 2-12 too (as strings: model/strict_yaml.py reads no base-60 numbers)
        seconds = parse_duration_s(value)
    except ValueError as e:
        raise SpecError(file, field, str(e).split(";")[0], f"write it like {DURATION_EXAMPLES} or 1:30:00") from None
    if seconds <= 0 or seconds > most_s:
        raise SpecError(
            file,
            field,
            f"{value} is out of range",
            f"give more than 0 and at most "
            f"{most_s / 86400:g} day{'s' if most_s > 86400 else ''}, e.g. `{field}: {FIELDS[field].example}`",
        )
    return seconds


def _cpus(value: Any, file: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 4096:
        raise SpecError(
            file, "cpus", f"{value!r} is not a number of CPU cores", "use a whole number >= 1, e.g. `cpus: 8`"
        )
    return value


def _mem(value: Any, file: str) -> int | None:
    if value is None:
        return None
    try:
        mib = parse_size_mib(value) if isinstance(value, str) else None
    except ValueError:
        mib = None
    if mib is None or mib <= 0:
        raise SpecError(
            file, "mem", f"{value!r} is not a size", f"write the host RAM the job needs like {SIZE_EXAMPLES}"
        )
    return mib


def _hosts(value: Any, file: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(h, str) and h for h in value):
        raise SpecError(file, "hosts", "must be a list of host names", "e.g. `hosts: [box-a, box-b]`")
    return tuple(value)


def _job_ids(value: Any, field: str, file: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(i, str) for i in value):
        raise SpecError(file, field, "must be a list of job ids", f"e.g. `{field}: {FIELDS[field].example}`")
    for job_id in value:
        if not JOB_ID_RE.match(job_id):
            raise SpecError(
                file,
                field,
                f"{job_id!r} is not a job id",
                f"give the ids `gpuq submit` printed ({ID_RULE})",
            )
    return tuple(dict.fromkeys(value))


RESTART_POLICIES = ("never", "on-failure", "always")


def _restart(value: Any, file: str) -> str:
    if value is None:
        return "never"
    if value not in RESTART_POLICIES:
        raise SpecError(
            file,
            "restart",
            f"{value!r} is not a restart policy",
            "write `restart: on-failure` (restart when it fails) or `restart: always`",
        )
    return value
