"""`gpuq submit`: options -> a spec in jobs/, checked exactly as a worker would check it."""

from __future__ import annotations

import argparse
import datetime
import os
import re
import stat
import sys
import time
from pathlib import Path

from gpuq import hooks
from gpuq.cli.batch_script import ScriptError, command_of, directives, is_script, with_script_options
from gpuq.cli.common import open_layout, read_config, verbs_of
from gpuq.cli.placeable import check_submittable
from gpuq.cli.requests import live_workers, run_request
from gpuq.host.wake import poke
from gpuq.model.errors import SpecError
from gpuq.model.groups import GroupError, parse_array
from gpuq.model.moments import parse_moment
from gpuq.model.spec import JobSpec, parse_spec_text, validate_spec
from gpuq.model.strict_yaml import load_yaml
from gpuq.model.units import format_limit, parse_slurm_time_s
from gpuq.single_instance import this_host
from gpuq.spool.intake import read_spec_file
from gpuq.spool.layout import Layout
from gpuq.spool.submit import (
    SubmitError,
    check_size,
    checked_spec_text,
    exported_environment,
    free_id,
    readable_base,
    spec_bytes,
    withheld_note,
    write_spec,
)
from gpuq.spool.sweeps import array_members, group_members


def _file_fields(path: str) -> dict:
    """`gpuq submit --spec FILE`: the file's fields, once the file alone has been checked
    exactly as a worker would check it (the same refusal, naming the file)."""
    raw, _ = read_spec_file(Path(path), path)
    parse_spec_text(raw, path, new=True)
    return load_yaml(raw, path)


def _submitted(args: argparse.Namespace, job_id: str, held_text: bytes | None = None) -> int:
    """The id, the only line on stdout (`jid=$(gpuq submit ...)`, as `sbatch --parsable`).
    With --hold, the spec goes in a request that a worker applies by creating it held (never
    through jobs/, where another member could take its id before the hold); with no live
    worker the request waits (exit 3), and when it is refused nothing was submitted: no id is
    printed."""
    rc = 0
    if held_text is not None:
        rc = run_request(args, "submit-held", (job_id,), shown_as="submit", quiet=True, text=held_text.decode("utf-8"))
        if rc == 1:
            return rc
        if rc == 0:
            print(f"gpuq submit: {job_id} is held: `gpuq release {job_id}` puts it in the queue", file=sys.stderr)
    print(job_id)
    return rc


def cmd_submit(args: argparse.Namespace) -> int:
    """Options -> a spec, or with --spec FILE the file's fields with the options over them
    (as sbatch's options win over a script's #SBATCH lines): never one dropped silently."""
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if is_script(command):  # `gpuq submit train.sbatch`: its #SBATCH lines under the options typed
        try:
            found = directives(command[0])
            if found is not None:
                notes = with_script_options(args, verbs_of(args.parser).choices["submit"], command[0], found)
                script = command[0]
                command, copied = command_of(script, command[1:], os.stat(open_layout(args).jobs).st_gid)
                for note in [*notes, *([copied] if copied else [])]:
                    print(f"gpuq submit: {note}", file=sys.stderr)
                args.name = args.name or Path(script).stem  # sbatch names a job after its script
        except ScriptError as e:
            print(f"gpuq submit: {e}. Nothing was written.", file=sys.stderr)
            return 2
    if not command and not args.spec:
        print(
            "gpuq submit: give the command after --, e.g. gpuq submit --gpus 1 --gpu-mem 20GiB -- python train.py",
            file=sys.stderr,
        )
        return 2
    layout = open_layout(args)
    try:
        from_file = _file_fields(args.spec) if args.spec else {}
        from_extras = extras_fields(args)
        env, withheld = exported_environment(args.export, isolated=_isolated({**from_file, **from_extras}))
        given = {**_given_fields(args, command), **from_extras}
    except SpecError as e:
        print(f"gpuq submit: {e} Nothing was written.", file=sys.stderr)
        return 2
    except (SubmitError, OSError) as e:
        print(f"gpuq submit: {args.spec + ': ' if args.spec else ''}{e}. Nothing was written.", file=sys.stderr)
        return 2
    if replaced := sorted(k for k in given if k != "env" and k in from_file and from_file[k] != given[k]):
        changes = ", ".join(f"{k} ({from_file[k]!r} -> {given[k]!r})" for k in replaced)
        print(f"gpuq submit: {args.spec}: the options given replace its {changes}", file=sys.stderr)
    # Where the file is silent, what a submit from here means: this directory, whole GPUs, one
    # of them, and the environment exported (the file's variables and --env over it).
    data = {"gpus": 1, "workdir": os.getcwd(), **defaults_of_extras({**from_file, **given}), **from_file, **given}
    data["env"] = {**env, **(from_file.get("env") or {}), **given.get("env", {})}
    try:
        config = read_config(layout)
        checked = validate_spec(data, "gpuq submit", new=True)
        check_submittable(layout, config, checked)
        base = readable_base(command, args.name or checked.name or (Path(args.spec).stem if args.spec else None))
        job_id, held_text = _place(layout, data, checked, args, base)
        if job_id is None:
            return 2
    except SpecError as e:
        optional = e.field in SUBMIT_OPTIONS or e.field in from_extras
        where = f"--{e.field.replace('_', '-')}" if e.field and optional else (e.field or "spec")
        fix = e.fix.replace(f"`{e.field}: ", f"`{where} ") if optional else e.fix  # the option's words, not the spec's
        print(f"gpuq submit: {where}: {e.problem}. Fix: {fix}. Nothing was written.", file=sys.stderr)
        return 2
    except SubmitError as e:
        print(f"gpuq submit: {e}", file=sys.stderr)
        return 2
    _warn_after(layout, args, data, [name for name in withheld if name not in data["env"]])
    poke(layout.local_dir(this_host(), config.local_dir))
    return _submitted(args, job_id, held_text)


def _place(
    layout: Layout, data: dict, checked: JobSpec, args: argparse.Namespace, base: str
) -> tuple[str | None, bytes | None]:
    """Write the spec (an array's or a sweep's one spec, whose members a worker writes), or
    with --hold only check it and pick its id: (id, the held spec's text); (None, None) after
    saying why not."""
    if args.hold:  # the group's one spec held, as sbatch --hold --array: its members come at release
        if args.array:
            check_size(spec_bytes(data), data["env"])
            data = {**data, "array": args.array}
        job_id = free_id(layout, args.id, base)
        try:
            members = _members_of(data, job_id) if args.array or checked.sweep else []
        except GroupError as e:
            print(f"gpuq submit: {e}", file=sys.stderr)
            return None, None
        held_text = checked_spec_text(layout, data)
        if members:
            print(f"{job_id}: {_members_line(members)} once released", file=sys.stderr)
        return job_id, held_text
    if args.array:
        check_size(spec_bytes(data), data["env"])  # each member is this spec and two variables
        return submit_array(layout, data, args, base), None
    if checked.sweep:
        job_id = write_spec(layout, data, args.id, base)
        print(f"{job_id}: {_members_line(_members_of(data, job_id))} (gpuq show {job_id})", file=sys.stderr)
        return job_id, None
    return write_spec(layout, data, args.id, base), None


def _members_of(data: dict, group: str) -> list[str]:
    """The ids a worker will write for a sweep's or array's spec."""
    return [member for member, _ in group_members(data, group)[1]]


def _workdir_problem(workdir: str) -> str | None:
    """Why the submitter could not work in `workdir` here, if they could not (a teammate's
    home they may not enter read "not a directory")."""
    try:
        st = os.stat(workdir)
    except PermissionError:
        return "is behind a directory you may not enter"
    except OSError:
        return "is not a directory here"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory here"
    if not os.access(workdir, os.X_OK):
        return "is a directory you may not enter"
    return None


def _warn_after(layout: Layout, args: argparse.Namespace, data: dict, withheld: list[str]) -> None:
    """What the submitter should know of a spec written: variables left out (--env may set
    one), a workdir not here, and no worker to run it."""
    if withheld:
        print(withheld_note(withheld), file=sys.stderr)
    if args.workdir and (problem := _workdir_problem(data["workdir"])):  # a box's local disk may have it: a warning
        print(
            f"gpuq submit: warning: --workdir {data['workdir']} {problem}; the job fails to "
            "start unless it is one you may enter on the box that runs it",
            file=sys.stderr,
        )
    if not args.hold and not live_workers(layout):  # (a held one's request says so itself)
        print(
            "gpuq submit: no worker is running on any host: the job waits until one starts (cron starts one "
            "each minute where it is set up; gpuq doctor)",
            file=sys.stderr,
        )


def _given_fields(args: argparse.Namespace, command: list[str]) -> dict:
    """The spec fields the options given set (an option left out sets nothing)."""
    after, after_any = _dependencies(args)
    given: dict = {}
    if command:
        given["command"] = command[0] if len(command) == 1 else command
    if args.gpus is not None:
        given["gpus"] = args.gpus
    for field in ("gpu_mem", "name"):
        if getattr(args, field):
            given[field] = getattr(args, field)
    if args.priority is not None:
        given["priority"] = int(args.priority) if re.fullmatch(r"-?\d+", args.priority) else args.priority
    if args.hosts:
        given["hosts"] = args.hosts.split(",")
    if args.workdir:
        given["workdir"] = os.path.abspath(args.workdir)
    if after:
        given["after"] = after
    if after_any:
        given["after_any"] = after_any
    if args.sweep:
        given["sweep"] = _sweep(args.sweep)
    for pair in args.env or []:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SubmitError(f"--env {pair!r}: write NAME=VALUE")
        given.setdefault("env", {})[key] = value
    if args.begin:
        try:
            begin = parse_moment(args.begin, time.time(), ahead=True)
        except ValueError as e:
            raise SubmitError(f"--begin {e}") from None
        # As a spec writes it: the instant, with this box's offset (another box's clock zone may differ).
        given["begin"] = datetime.datetime.fromtimestamp(begin).astimezone().isoformat(timespec="seconds")
    _check_environments(args)
    return {**given, **environment_fields(args), **limit_fields(args)}


def _check_environments(args: argparse.Namespace) -> None:
    """--venv and --conda (a path) where the submitter sees them (a team's environments live
    on the shared disk): a typo is said now, not as a failed job later. A spec file's fields
    are checked as a worker checks them, which cannot see the submitter's disk."""
    if args.venv and not os.path.isfile(os.path.join(args.venv, "bin", "activate")):
        raise SubmitError(
            f"--venv {args.venv} has no bin/activate. Fix: make it with `python -m venv {args.venv}`, or give "
            "the virtualenv's directory as the boxes see it"
        )
    if args.conda and args.conda.startswith("/") and not os.path.isdir(os.path.join(args.conda, "conda-meta")):
        raise SubmitError(
            f"--conda {args.conda} is not a conda environment (no conda-meta/). Fix: give the environment's "
            "directory, or its name"
        )


def _sweep(values: list[str]) -> dict[str, list[str]]:
    """--sweep lr=1e-3,3e-4 --sweep seed=1,2,3 -> {lr: [1e-3, 3e-4], seed: [1, 2, 3]}, each value
    as typed (substituted into the command as text: 1e-3 stays 1e-3)."""
    sweep: dict[str, list[str]] = {}
    for value in values:
        name, sep, listed = value.partition("=")
        if not sep or not name.strip() or not listed.strip():
            raise SubmitError(f"--sweep {value!r}: write NAME=VALUE,VALUE,... such as lr=1e-3,3e-4")
        if name.strip() in sweep:
            raise SubmitError(f"--sweep {name.strip()} is given twice: give its values once, comma-separated")
        sweep[name.strip()] = [v.strip() for v in listed.split(",") if v.strip()]
    return sweep


LIMIT_OPTIONS = ("time_limit", "gpu_compute", "cpus", "mem", "grace", "retries", "restart")
SUBMIT_OPTIONS = (
    "gpus",
    "gpu_mem",
    "name",
    "priority",
    "hosts",
    "workdir",
    "env",
    "after",
    "after_any",
    "venv",
    "conda",
    "setup",
    "preemptible",
    "sweep",
    *LIMIT_OPTIONS,
)


def limit_fields(args: argparse.Namespace) -> dict:
    """--time-limit, --gpu-compute, --cpus, --mem, --grace, --retries, --restart and --preemptible -> the
    spec's fields. Each value is read as the same field in a spec file is (a YAML scalar: `4`
    a number, `2h` a duration, `8GiB` a size), so that one check judges both."""
    data: dict = {}
    for field in LIMIT_OPTIONS:
        value = getattr(args, field)
        if value is None:
            continue
        if field == "time_limit":  # as sbatch reads --time (90: minutes), never as YAML would
            data[field] = _time_limit(value)
            continue
        if field == "mem" and value.strip().isdigit():  # as sbatch reads --mem 8000: megabytes
            if int(value) == 0:
                raise SubmitError("--mem 0 (sbatch's \"all the box's memory\") is not one gpuq has: leave --mem out")
            value = f"{value.strip()}MiB"
        try:  # as a spec file's scalar is read (no base-60 numbers: --grace 1:30 is sbatch's 1:30)
            data[field] = load_yaml(value.encode(), "gpuq submit")
        except SpecError:
            data[field] = value  # the spec's check names the option and the fix
    if args.preemptible:
        data["preemptible"] = True
    return data


def _time_limit(text: str) -> str:
    """--time as sbatch reads it, written into the spec in its own unit (a number there is seconds)."""
    try:
        seconds = parse_slurm_time_s(text)
    except ValueError as e:
        raise SubmitError(f"--time {text}: {e}") from None
    return format_limit(seconds)


def extras_fields(args: argparse.Namespace) -> dict:
    """The options the extras' spec fields add (--container/--runtime/--mount) -> those fields."""
    data: dict = {}
    for name, extra_field in hooks.registry().spec_fields.items():
        if extra_field.from_options is None:
            continue
        try:
            value = hooks.load(extra_field.from_options)(args)
        except ValueError as e:
            raise SubmitError(str(e)) from None
        if value is not None:
            data[name] = value
    return data


def defaults_of_extras(fields: dict) -> dict:
    """The extras' fields that neither the spec file nor the options set, from the member's
    own defaults (the notify extra's `on:` in ~/.config/gpuq/notify.yaml): a default that
    cannot be read is a warning, never a refused submit."""
    data: dict = {}
    for name, extra_field in hooks.registry().spec_fields.items():
        if extra_field.submit_default is None or name in fields:
            continue
        try:
            value = hooks.load(extra_field.submit_default)()
        except ValueError as e:
            print(f"gpuq submit: warning: no default `{name}:` ({e})", file=sys.stderr)
            continue
        if value is not None:
            data[name] = value
    return data


def _isolated(fields: dict) -> bool:
    """Whether one of these fields is an extra's that keeps the host's environment from the
    job (an image's own): then `--export` defaults to NONE."""
    return any(extra.isolated for name, extra in hooks.registry().spec_fields.items() if name in fields)


def environment_fields(args: argparse.Namespace) -> dict:
    """--venv, --conda, --setup -> the spec's fields."""
    data: dict = {}
    for key in ("venv", "conda", "setup"):
        if getattr(args, key):
            data[key] = getattr(args, key)
    return data


def _dependencies(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """--after and --after-any, with sbatch's --dependency afterok:A:B,afterany:C added to them."""
    after, after_any = _ids(args.after), _ids(args.after_any)
    for value in args.dependency or []:
        for clause in value.split(","):
            kind, _, ids = clause.partition(":")
            if kind not in ("afterok", "afterany") or not ids:
                raise SubmitError(
                    f"--dependency {value}: {clause!r} is not one gpuq takes. Fix: afterok:ID[:ID] (--after) "
                    "or afterany:ID[:ID] (--after-any), several joined by commas"
                )
            (after if kind == "afterok" else after_any).extend(i for i in ids.split(":") if i)
    return after, after_any


def _ids(values: list[str] | None) -> list[str]:
    """Repeated or comma-separated ids: --after a --after b,c -> [a, b, c]."""
    return [i for v in values or [] for i in v.split(",") if i]


def submit_array(layout, data: dict, args: argparse.Namespace, base: str) -> str | None:
    """`gpuq submit --array 0-9`: one spec with `array: 0-9` in jobs/; the worker that reads
    it writes one job per index, <id>_<index>, each with GPUQ_ARRAY_INDEX (spool/sweeps.py)."""
    try:
        indices = parse_array(args.array)
    except GroupError as e:
        print(f"gpuq submit: {e}", file=sys.stderr)
        return None
    group = write_spec(layout, {**data, "array": args.array}, args.id, base)
    members = [member for member, _ in array_members(data, group, indices)]
    print(
        f"{group}: {_members_line(members)} (gpuq show {group}; gpuq cancel {group})",
        file=sys.stderr,
    )
    return group


def _members_line(members: list[str]) -> str:
    """`6 jobs, hp-1_a ... hp-1_f`; `1 job, a-4_7`."""
    if len(members) == 1:
        return f"1 job, {members[0]}"
    return f"{len(members)} jobs, {members[0]} ... {members[-1]}"
