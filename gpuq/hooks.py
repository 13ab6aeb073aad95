"""The one registry through which extras (`gpuq/extras/NAME/`) add to the core: the core
asks the registry, never an extra by name (tools/layers.py refuses such an import).

An extra is found by listing `gpuq/extras/`: each package there is imported and its
`register(registry)` called, once per process. A deleted extra's folder is simply not there.
What an extra's `register` may add is the fields of `Registry`; docs/design.md, "The new
shape", says which part of the core asks for each.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import pkgutil
import stat
import sys
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from gpuq.model.config import KEYS, KEYS_OF_EXTRAS, Config

log = logging.getLogger("gpuq.worker")
EXTRAS_DIR = Path(__file__).resolve().parent / "extras"


@dataclass(frozen=True)
class Verb:
    """A verb an extra adds to `gpuq`. `setup` adds its arguments to the verb's parser
    (argparse only, importing nothing heavy: it runs where the verb's parser is built, for the
    verb itself, `gpuq --help`, the completion script and a mistyped verb); `handler` is
    "module:function" under gpuq, loaded only when the verb runs, as the core's own verbs are
    (cli/verbs.py _lazy)."""

    name: str
    help: str
    setup: Callable[[argparse.ArgumentParser], None]
    handler: str
    slurm: str = ""  # the Slurm command it stands for: `gpuq srun` then points to it


@dataclass(frozen=True)
class BoxPublisher:
    """Something an extra writes each time a worker publishes its box's state (with its
    heartbeat: at most once per poll interval), such as the reports extra's Prometheus metrics.
    `start` is "module:function" under gpuq, loaded when a worker starts (a CLI start never
    imports it): called once with the worker's Layout, Config and host name, it gives the
    function each publication calls with a `worker.publishing.Published` (that module has the
    types: `StartPublisher`, `Publish`). `name` is how the worker's log calls it. `last_word`:
    it is called once more as the worker stops (`Published.last`: the samples' partial line);
    the others are not (a notify delivery started then would outlive the worker that tends it)."""

    name: str
    start: str
    last_word: bool = False


@dataclass(frozen=True)
class SpecField:
    """A spec field an extra adds (`container`), with what a reader is told of it (`type`,
    `default`, `doc`, `example`: as model/spec_fields.py `Field` says a core field's; plain
    words, so that registering it imports nothing, root's `gpuq` included). The rest are
    "module:function" under gpuq, loaded only for a spec that sets the field (so a CLI start,
    and a spec without it, import nothing of the extra):
    - `parse`: (value, fail) -> the field's value as JSON, or None for none; `fail(field,
      problem, fix)` makes the SpecError to raise (model/spec.py validate_spec asks it).
    - `need`: (value, config) -> the name a host must offer for the job to be placed there (a
      container runtime, matched against its worker's `HostOffers`), or None; the plan is
      handed it as a value (`needs_of`).
    `options` adds `gpuq submit` options (argparse only, like Verb.setup: every submit runs
    it); `from_options` is "module:function": (argparse.Namespace) -> the field's value or
    None, raising ValueError with the message for a wrong combination. `isolated`: a job with
    the field does not see the host's environment (an image's own), so `gpuq submit` exports
    none of the submitter's variables by default. `submit_default`, "module:function": () ->
    the field's value or None, asked by `gpuq submit` (as the member) only where neither the
    spec file nor the options set the field (the notify extra's default events, from the
    member's own file); raising ValueError says why it gave none, as a warning."""

    name: str
    type: str
    default: str
    doc: str
    example: str
    parse: str
    need: str | None = None
    options: Callable[[argparse.ArgumentParser], None] | None = None
    from_options: str | None = None
    isolated: bool = False
    submit_default: str | None = None


@dataclass(frozen=True)
class LaunchWrapper:
    """A change to how a job's run starts, made by its supervisor just before the root part
    starts it (run/launch.py): a container's client around the command.
    The root part's checks are the same for every start (host/privsep.py): a wrapper changes
    the argv, environment and stdin it is asked to start, never what may be started as whom.
    `field`: the spec field that asks for it (the wrapper is loaded only for such a job; None:
    asked for every job). `wrap` is "module:function" under gpuq: called with a
    `run.launch.Start`, it gives a `run.launch.Wrapped` (or None: not this job's), or raises
    `run.launch.CannotStart` (the types are there). `recover`, "module:function" too: called by
    a worker with a `run.launch.Leftover` for an attempt whose supervisor died, it removes what
    the run left outside its process tree (a daemon's container) and says what, or None."""

    name: str
    field: str | None
    wrap: str
    recover: str | None = None


@dataclass(frozen=True)
class HostOffers:
    """What a box offers jobs beyond its GPUs (the container runtimes it has), probed by its
    worker and published in its heartbeat (`runtimes`, `runtime_problems`): `start` is
    "module:function" under gpuq, loaded when a worker starts, called with its Config and
    whether it is a team's queue account's worker; it gives an object with `found` (name ->
    version), `problems` (name -> why unusable) and `refresh(now_mono)` (worker/loop.py
    `OfferFinder`)."""

    name: str
    start: str


@dataclass(frozen=True)
class GpuSharing:
    """How jobs placed on one GPU share it beyond the driver's time-slicing (the mps extra's
    NVIDIA MPS control daemons, config `gpu_sharing: mps`), run by the worker. `start` is
    "module:function" under gpuq, loaded when a worker starts, called with its private local
    directory, the root part where it starts daemons as root (host/rootorders.py Orders, else
    None), its Config and `report_once(key, message)` (a warning logged once); it gives a
    `worker.starting.GpuSharer`: what a job about to start gets from it (its daemon's pipe and
    its compute share, made the record's `mps_pipe` and `mps_compute_pct`), what each pass and
    the worker's end let it settle (daemons no job uses any more), and what the heartbeat says
    of it (`mps`). Without one, every job is time-sliced, as under gpu_sharing: time-slicing."""

    name: str
    start: str


@dataclass(frozen=True)
class DoctorCheck:
    """What `gpuq doctor` says, for an extra, of each box whose worker is alive (the mps
    extra: whether MPS is usable there, as the heartbeat's `mps` says). `check` is
    "module:function" under gpuq, loaded when doctor runs (as the queue's account, never as
    root): called with the box's name, its heartbeat (a dict), the Config and whether the
    reader owns the root (who does the fix: `cli.doctor.fix_on`), it gives a list of
    `cli.doctor.Finding`. One that raises is reported as a warning, and the rest go on."""

    name: str
    check: str


@dataclass(frozen=True)
class PlacementRule:
    """GPUs an extra sets aside for someone over a window (the bookings extra's bookings).
    `set_aside` is "module:function" under gpuq, a function (layout, now) -> list of
    model.jobs.SetAside, called at the edge (a worker's pass, `gpuq status`), which reads what
    it needs from disk; the plan is handed the values, never the rule (sched/plan.py stays pure)."""

    name: str
    set_aside: str


@dataclass(frozen=True)
class StatusSection:
    """A section of `gpuq status` (the bookings extra's BOOKINGS). `read` is "module:function"
    under gpuq, (layout, now, the live boxes' names) -> a JSON-able value, put in the status view (`status --json`)
    under `name`; `render` is "module:function" under gpuq, (that value, as safe text) -> the
    section's lines, shown after the core's section `after` (its title: HOSTS, RUNNING,
    PENDING, HELD), on `gpuq top` too. `title` is the section's first word (`gpuq top` orders
    sections by it)."""

    name: str
    title: str
    read: str
    render: str
    after: str = "PENDING"


@dataclass(frozen=True)
class RetryRule:
    """Whether an attempt that failed on its own (no cancel, limit or preemption) goes back to
    its place in the queue with its spec changed: the oom extra's retry after CUDA ran out of
    memory, with more `gpu_mem`. `decide` is "module:function" under gpuq, loaded by the job's
    supervisor only for such an attempt: called with a `run.retry.Failure` and the config keys
    only extras read (by Config attribute: run/joblocal.py Runtime.settings), it gives a
    `run.retry.Retry` (why, and the spec fields to set) or None (the types are there).
    The worker then requeues the attempt as for a preemption (worker/recovery.py), with the
    spec text changed and the record's `failure_retries` one higher."""

    name: str
    decide: str


@dataclass
class Registry:
    verbs: list[Verb] = field(default_factory=list)
    loaded: list[str] = field(default_factory=list)  # the extras' names
    # Extras that could not be loaded, each with why (`fix` says what to do): the core runs
    # without them (one broken folder must not take down `gpuq status` or a worker).
    broken: dict[str, str] = field(default_factory=dict)
    # Worker kinds by the config's `backend` ("local" is the core's own worker): "module:class"
    # under gpuq, a class taking what worker.loop.Worker takes, loaded when a worker starts.
    backends: dict[str, str] = field(default_factory=dict)
    # What the extras write beside the heartbeat (worker/publishing.py), in the extras' order.
    publishers: list[BoxPublisher] = field(default_factory=list)
    # GPUs set aside over a window (the plan, as values) and sections of `gpuq status`.
    placement_rules: list[PlacementRule] = field(default_factory=list)
    views: list[StatusSection] = field(default_factory=list)
    # Request kinds of the inbox (spool/inbox.py) beyond the core's own verbs: kind ->
    # "module:function" under gpuq, a `spool.applying.ApplyKind` the worker applies it with.
    request_kinds: dict[str, str] = field(default_factory=dict)
    # Spec fields beyond the core's, by name (model/spec.py, model/spec_fields.py, cli/submit.py).
    spec_fields: dict[str, SpecField] = field(default_factory=dict)
    # Changes to how a job starts, in the extras' order (run/launch.py), and what a box offers.
    launch_wrappers: list[LaunchWrapper] = field(default_factory=list)
    offers: list[HostOffers] = field(default_factory=list)
    # How jobs share a GPU beyond time-slicing (worker/starting.py): the mps extra's daemons.
    gpu_sharing: list[GpuSharing] = field(default_factory=list)
    # What `gpuq doctor` says of each live box for an extra (cli/doctor.py).
    doctor_checks: list[DoctorCheck] = field(default_factory=list)
    # Failed attempts that go back to the queue with a changed spec (run/retry.py).
    retry_rules: list[RetryRule] = field(default_factory=list)
    # Programs the root part may run as a member, by name -> a module under gpuq run with
    # `python -I` (the notify extra's deliverer): host/privsep.py runs only a name registered
    # here (root-owned code, never input), as a member of the queue's group, never root.
    member_programs: dict[str, str] = field(default_factory=dict)


# Every field of Registry but the two that say which extras loaded: each is a hook.
HOOKS = tuple(f.name for f in fields(Registry) if f.name not in ("loaded", "broken"))

_registry: Registry | None = None


def registry() -> Registry:
    """Every extra's contributions; the extras are imported the first time it is asked for."""
    global _registry
    if _registry is None:
        found = Registry()
        for module in sorted(pkgutil.iter_modules([str(EXTRAS_DIR)]), key=lambda m: m.name):
            if module.ispkg:
                _register(module.name, found)
        _registry = found
    return _registry


def _untrusted(name: str) -> str | None:
    """Why the folder gpuq/extras/NAME is not code to run, or None. An extra runs in every
    gpuq process, root's `gpuq` too, before anything else is checked: it must be a real folder
    (a link would take the code from elsewhere), with an `__init__.py` that is a plain file, both
    of the package's owner and writable by nobody else, and a name that is a Python identifier
    (a copy such as `slurm-old` would register its verbs a second time)."""
    if not name.isidentifier():
        return "its name is no Python identifier (a renamed copy?)"
    owner = os.stat(EXTRAS_DIR.parent).st_uid
    for path in (EXTRAS_DIR / name, EXTRAS_DIR / name / "__init__.py"):
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            return f"{path} is a symbolic link"
        if st.st_uid != owner or st.st_mode & 0o022:
            return f"{path} is not gpuq's own (owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _register(name: str, into: Registry) -> None:
    """Load one extra into the registry, or note it as broken: all of an extra or none of it."""
    trial = Registry()
    try:
        if (why := _untrusted(name)) is not None:
            raise ImportError(why)
        module = importlib.import_module(f"gpuq.extras.{name}")
        register = getattr(module, "register", None)
        if not callable(register):
            raise TypeError("it has no register(registry) function")
        register(trial)
        clash = set().union(*(_names(getattr(trial, hook)) & _names(getattr(into, hook)) for hook in HOOKS))
        if clash:
            raise ValueError(f"another extra already gives {', '.join(sorted(clash))}")
    except (Exception, SystemExit) as e:  # someone else's code: whatever it raises, the core goes on
        into.broken[name] = f"the extra gpuq/extras/{name} could not be loaded ({type(e).__name__}: {e})"
        return
    into.loaded.append(name)
    for hook in HOOKS:
        given, found = getattr(trial, hook), getattr(into, hook)
        if isinstance(found, dict):
            found.update(given)
        else:
            found += given


def _names(given: list[Any] | dict[str, Any]) -> set[str]:
    """What one hook's contributions are called: two extras may not give the same one."""
    return set(given) if isinstance(given, dict) else {item.name for item in given}


def fix(name: str) -> str:
    """What to do about a broken extra: for one that others may write (a checkout copied with
    a group's write bit), taking that away; else a repair; or its folder gone."""
    if "is not gpuq's own" in registry().broken.get(name, ""):
        return (
            f"let only gpuq's owner write it: chmod -R go-w {EXTRAS_DIR / name} (and chown it to the owner of "
            f"{EXTRAS_DIR.parent}), or delete the folder gpuq/extras/{name}"
        )
    return f"repair it (reinstall gpuq from its checkout), or delete the folder gpuq/extras/{name}"


def unused_keys(config: Config) -> list[tuple[str, str]]:
    """Each key of `config` set (not at its default) that only an extra reads, while that
    extra is not loaded: what goes unused and why, and the fix."""
    found = []
    for key, extra in KEYS_OF_EXTRAS.items():
        attr = KEYS[key][0]
        if getattr(config, attr) == getattr(Config(), attr) or extra in registry().loaded:
            continue
        why = registry().broken.get(extra) or f"gpuq/extras/{extra} is not there"
        found.append(
            (
                f"config.yaml sets {key}, which only the {extra} extra reads, and {why}: it goes unused",
                f"restore gpuq/extras/{extra} (reinstall gpuq from its checkout), or remove {key} from config.yaml",
            )
        )
    return found


def sharing_of(config: Config) -> Config:
    """`config` as the plan is handed it, at the edge: where no loaded extra runs the config's
    `gpu_sharing` (the mps extra deleted), time-slicing, as its worker then runs every job,
    so that the plan's rule for MPS jobs (one user's per GPU, packed: model/sharing.py) does
    not hold GPUs for a sharing that nothing runs."""
    default = Config().gpu_sharing
    if config.gpu_sharing == default or any(g.name == config.gpu_sharing for g in registry().gpu_sharing):
        return config
    return replace(config, gpu_sharing=default)


def load(spec: str) -> Any:
    """What a "module:name" under gpuq names (a backend's worker class, a publisher's start),
    imported now."""
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(f"gpuq.{module}"), name)


def module_argv(module: str) -> list[str]:
    """The command line that runs gpuq's module `module` (under gpuq: "extras.notify.deliver")
    as a program, its arguments to follow: this interpreter, isolated (-I: no PYTHON*
    variables, no user site, no current directory on sys.path), gpuq's code taken where this
    process took it. For what runs as a member: the notify extra's deliverer (the root part
    starts it), the interactive extra's end of a session (the job runs it). ValueError for a
    name that is not a module's (never made into code to run)."""
    if not all(part.isidentifier() for part in module.split(".")):
        raise ValueError(f"{module!r} is not a module's name")
    package_parent = str(Path(__file__).resolve().parent.parent)
    boot = (
        f"import sys, runpy; sys.path.insert(0, {package_parent!r}); "
        f"runpy.run_module('gpuq.{module}', run_name='__main__', alter_sys=True)"
    )
    return [sys.executable, "-I", "-c", boot]


def start_each(kind: str, entries: Sequence[Any], *args: object, without: str) -> list[tuple[str, Any]]:
    """Each entry's `start` ("module:function") loaded and called with `args`, as a worker
    starts: (its name, what it gave). One that fails to start is logged and left out (an
    extra's code must not stop the worker); `without` says what its absence means."""
    started = []
    for entry in entries:
        try:
            started.append((entry.name, load(entry.start)(*args)))
        except Exception:
            log.exception("the extras' %s %s (%s) could not start: %s", kind, entry.name, entry.start, without)
    return started


def set_aside(layout: Any, now: float) -> list[Any]:
    """Every placement rule's GPUs set aside (model.jobs.SetAside, not imported here: model.spec
    asks this registry for the extras' spec fields, and model.jobs imports model.spec), for the
    plan: read now."""
    return [aside for rule in registry().placement_rules for aside in load(rule.set_aside)(layout, now)]


# Directories under state/ that only an extra reads and writes, each with that extra (as
# KEYS_OF_EXTRAS for config keys): without it, what they hold goes unused, and `doctor` says so.
STATE_OF_EXTRAS: dict[str, str] = {"bookings": "bookings"}


def unused_state(state_dir: Path) -> list[tuple[str, str]]:
    """Each directory of STATE_OF_EXTRAS under `state_dir` that holds files while its extra
    is not loaded: what goes unused and why, and the fix."""
    found = []
    for name, extra in STATE_OF_EXTRAS.items():
        if extra in registry().loaded:
            continue
        try:
            held = sum(1 for _ in os.scandir(state_dir / name))
        except OSError:
            continue
        if held:
            why = registry().broken.get(extra) or f"gpuq/extras/{extra} is not there"
            found.append(
                (
                    f"state/{name} holds {held} file(s) that only the {extra} extra reads, and {why}: "
                    "they are ignored (nothing there is honoured or shown)",
                    f"restore gpuq/extras/{extra} (reinstall gpuq from its checkout), or remove state/{name}'s files",
                )
            )
    return found


# The spec fields the core knows of but no loaded extra gives, with the extra that would:
# a spec that sets one is refused with the fix (a spec from before the extra was deleted).
FIELDS_OF_EXTRAS: dict[str, str] = {
    "container": "containers",
    "retry_on_oom": "oom",
    "attach": "interactive",
    "notify": "notify",
}


def missing_field(name: str) -> tuple[str, str] | None:
    """Why the spec field `name` cannot be taken here, and the fix, when an extra that is not
    loaded gives it; None for a field no extra gives."""
    extra = FIELDS_OF_EXTRAS.get(name)
    if extra is None or name in registry().spec_fields:
        return None
    why = registry().broken.get(extra) or f"gpuq/extras/{extra} is not there"
    return (
        f"needs the {extra} extra, which this installation does not have ({why})",
        f"restore gpuq/extras/{extra} (reinstall gpuq from its checkout), or remove `{name}:` from the spec",
    )


def spec_parser(name: str) -> Callable[..., Any] | None:
    """The parse function of the extras' spec field `name`, loaded now; None: no extra gives it."""
    found = registry().spec_fields.get(name)
    return load(found.parse) if found is not None else None


def needs_of(config: Config) -> Callable[[Mapping[str, Any]], str | None]:
    """What a job needs of a host (the name it must offer), from its spec's extras' fields: the
    value the plan is handed. A spec without such fields costs one test."""
    needs = {n: f.need for n, f in registry().spec_fields.items() if f.need is not None}
    loaded: dict[str, Callable[..., str | None]] = {}

    def need(extras: Mapping[str, Any]) -> str | None:
        for name, value in extras.items():
            if name in needs and value is not None:
                if name not in loaded:
                    loaded[name] = load(needs[name])
                if (found := loaded[name](value, config)) is not None:
                    return found
        return None

    return need
