"""The queue's config: defaults, loading from config.yaml, and `validate` with fixes."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from gpuq.model.errors import SpecError
from gpuq.model.strict_yaml import load_yaml
from gpuq.model.units import DURATION_EXAMPLES, MAX_DURATION_S, SIZE_EXAMPLES, parse_duration_s, parse_size_mib
from gpuq.model.windows import Window, parse_window

GPU_SHARING = ("time-slicing", "mps")


class ConfigError(Exception):
    """config.yaml cannot be used; the message names the key and the fix."""


RUNTIMES = ("docker", "podman", "apptainer")  # config container_runtime (the containers extra's)


@dataclass(frozen=True)
class Config:
    poll_interval: float = 1.0  # seconds between worker passes
    gpu_mem_reserve_mib: int = 256  # per GPU, never handed to jobs
    max_jobs_per_gpu: int = 4
    gpus: dict[str, list[int]] = field(default_factory=dict)  # host -> offered indices
    local_dir: str | None = None  # per-host local directory for locks
    cpu_slots: int = 2  # concurrent CPU-only (gpus: 0) jobs per host
    spec_settle_s: float = 5.0  # an unparsable spec is retried until unchanged this long
    grace_s: float = 10.0  # SIGTERM -> SIGKILL
    queue_lock_timeout_s: float = 2.0
    request_timeout_s: float = 30.0  # how long the CLI waits for a worker to apply a request
    recent_finished: int = 10  # finished jobs shown by `gpuq status`
    lost_after_s: float = 180.0  # a host whose heartbeat stands still this long is dead
    lost_retries: int = 2  # re-runs of a job lost with its host (spec: retries)
    run_for_users: tuple[str, ...] = ()  # a non-root worker also runs these users' specs
    admins: tuple[str, ...] = ()  # may cancel anyone's job (root always may)
    # What one member may hold (admins: no limit), so that nobody's specs fill a worker's memory
    # or book the team's GPUs away: pending specs (count, size together), GPU-hours booked ahead.
    max_pending_per_user: int = 10000
    max_pending_size_per_user_mib: int = 64
    max_booked_gpu_hours: float = 96.0
    allow_root_jobs: bool = False  # run specs owned by root (containers, single-user boxes)
    # Limits (docs/reference.md, "Limits"): defaults for specs that do not set them; None = none.
    time_limit_s: float | None = None
    cpus: int | None = None
    mem_mib: int | None = None
    gpu_mem_overuse: str = "warn"  # a job above its declared GPU memory: warn or kill
    gpu_mem_tolerance_pct: int = 10  # ... by more than this ...
    gpu_mem_overuse_after_s: float = 10.0  # ... for longer than this
    metrics_dir: str | None = None  # Prometheus textfile directory; None: <root>/state/metrics
    sample_every_s: float = 60.0  # a line in state/samples/ (utilization for `gpuq report`)
    alert_command: str | None = None  # gets each new alert as JSON on stdin (the alerts extra)
    alert_wait_s: float = 86400.0  # a job pending longer than this
    alert_idle_holder_s: float = 1800.0  # a job holding GPU memory at under alert_idle_util_pct
    alert_idle_util_pct: int = 5
    alert_gpu_temp_c: int = 85
    alert_gpu_power_w: float | None = None
    alert_worker_silent_s: float = 300.0  # a host whose heartbeat has not changed for this long
    alert_short_jobs: int = 200  # jobs under 10 s ended on one host within 10 minutes
    retry_on_oom: int = 1  # re-runs with more gpu_mem after CUDA ran out of memory (the oom extra)
    shell_idle_timeout_s: float = 3600.0  # a `gpuq shell` left this long without input or output ends
    # Scheduling (sched/plan.py; docs/scheduling.md).
    max_gpus_per_user: int | None = None  # GPUs one user's running jobs may hold at once
    # Within a priority, users who used less go first: GPU-seconds decayed by half every
    # fair_share_half_life_s, a GPU held now counting as age_step_s more (sched/fairshare.py).
    fair_share: bool = True
    fair_share_half_life_s: float = 7 * 86400.0
    age_step_s: float = 1800.0
    # The head of the queue gets GPUs reserved from when running jobs' time limits free them,
    # once it has waited reserve_after_s; only jobs that end by then may use them (backfill).
    reserve_after_s: float = 0.0
    reservations: bool = True
    spread: bool = True  # while GPUs sit idle, a job takes an empty one (sched/plan.py)
    fragmentation_aware: bool = True  # among equally tight fits, keep emptier hosts whole
    preemption: bool = True  # opportunistic jobs yield to higher-priority work
    gpu_sharing: str = "time-slicing"  # or mps: jobs sharing a GPU run under NVIDIA MPS (the mps extra)
    idle_util_pct: int = 10  # a GPU is idle while non-gpuq processes use less than this
    idle_after_s: float = 60.0  # ... for this long; only then may opportunistic jobs start
    idle_windows: tuple["Window", ...] = ()  # when opportunistic jobs may run; empty: always
    # Slurm, read by the slurm extra (gpuq/extras/slurm/: export.py, bridge.py, README.md).
    backend: str = "local"  # slurm: workers hand jobs to Slurm instead of running them
    container_runtime: str = "docker"  # a spec's container without a runtime runs with this one
    container_clients: dict[str, str] = field(default_factory=dict)  # runtime -> client's absolute path
    container_env: dict[str, str] = field(default_factory=dict)  # what every client gets (DOCKER_HOST, ...)
    allow_docker: bool = False  # docker jobs in a team queue: its daemon is root (gpuq/extras/containers/README.md)
    slurm_partitions: dict[str, str] = field(default_factory=dict)  # priority class -> partition
    slurm_qos: dict[str, str] = field(default_factory=dict)  # priority class -> QOS
    slurm_gpu_mem: str = "comment"  # how gpu_mem is expressed: comment, constraint or shards
    slurm_gpu_types: dict[str, int] = field(default_factory=dict)  # constraint: feature -> GPU memory
    slurm_shard_mib: int | None = None  # shards: the GPU memory one shard stands for
    slurm_jobcomp_file: str | None = None  # Slurm's JobCompLoc (jobcomp/filetxt), read by bridges

    def offered_gpus(self, host: str) -> list[int] | None:
        """Indices this host offers, or None for all of them."""
        return self.gpus.get(host)


# config.yaml key -> (Config attribute, parser). Sizes are written with units in the file.
def _size(v: Any) -> int:
    if not isinstance(v, str):
        raise ValueError(f"write a size with a unit, like {SIZE_EXAMPLES}")
    return parse_size_mib(v)


def _positive(kind: type) -> Any:
    """A positive number; NaN and infinity are refused (YAML's .nan passes `v <= 0`, and a
    worker given one sleeps forever, never fences, or never sends SIGKILL)."""
    what = f"a positive {'whole number' if kind is int else 'number'}"

    def parse(v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError(f"must be {what}")
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"must be {what}; .nan and .inf are not. Fix: write a finite number")
        if v <= 0 or (kind is int and v != int(v)):
            raise ValueError(f"must be {what}")
        return kind(v)

    return parse


def _seconds(v: Any) -> float:
    seconds = _positive(float)(v)
    if seconds > MAX_DURATION_S:  # time.sleep() and the clocks overflow long before that matters
        raise ValueError("is more than 100 years. Fix: write a number of seconds, e.g. 60")
    return seconds


def _non_negative_int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError("must be a whole number >= 0")
    return v


def _gpu_map(v: Any) -> dict[str, list[int]]:
    if v is None:
        return {}
    if not isinstance(v, dict) or not all(
        isinstance(h, str) and isinstance(ix, list) and all(isinstance(i, int) and i >= 0 for i in ix)
        for h, ix in v.items()
    ):
        raise ValueError("must map host names to lists of GPU indices, e.g. {box-a: [0, 1]}")
    return {h: list(ix) for h, ix in v.items()}


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise ValueError("must be true or false")
    return v


def _user_names(v: Any) -> tuple[str, ...]:
    if v is None:
        return ()
    if not isinstance(v, list) or not all(isinstance(u, str) and u for u in v):
        raise ValueError("must be a list of user names, e.g. [ana, bo]")
    return tuple(v)


def _optional_path(v: Any) -> str | None:
    if v is None:
        return None
    if not isinstance(v, str) or not v.startswith("/"):
        raise ValueError("must be an absolute path, e.g. /var/tmp/gpuq-{host}")
    return v


def _optional_positive_int(v: Any) -> int | None:
    return None if v is None else _positive(int)(v)


def _percent(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 100:
        raise ValueError("must be a whole number from 0 to 100")
    return v


def _positive_duration(v: Any) -> float:
    """A duration ("7d", "12h", seconds); never empty."""
    seconds = _optional_duration(v)
    if seconds is None:
        raise ValueError(f"is not a duration; write it like {DURATION_EXAMPLES}")
    return seconds


def _non_negative_seconds(v: Any) -> float:
    if v == 0 and not isinstance(v, bool):
        return 0.0
    return _seconds(v)


def _optional_duration(v: Any) -> float | None:
    if v is None:
        return None
    try:
        seconds = parse_duration_s(v)
    except ValueError:
        raise ValueError(f"is not a duration; write it like {DURATION_EXAMPLES}") from None
    if seconds <= 0:
        raise ValueError("must be longer than 0")
    return seconds


def _optional_size(v: Any) -> int | None:
    return None if v is None else _size(v)


def _optional_command(v: Any) -> str | None:
    if v is None:
        return None
    if not isinstance(v, str) or not v.strip():
        raise ValueError("must be a shell command, e.g. '/usr/local/bin/notify-team'")
    return v


def _optional_positive_float(v: Any) -> float | None:
    return None if v is None else _positive(float)(v)


def _overuse_action(v: Any) -> str:
    if v not in ("warn", "kill"):
        raise ValueError("must be warn or kill")
    return v


def _class_map(v: Any) -> dict[str, str]:
    if v is None:
        return {}
    if not isinstance(v, dict) or not all(
        k in ("high", "normal", "low") and isinstance(x, str) and x for k, x in v.items()
    ):
        raise ValueError("must map priority classes to names, e.g. {high: gpu-high, normal: gpu, low: scavenger}")
    return dict(v)


def _backend(v: Any) -> str:
    if v not in ("local", "slurm"):
        raise ValueError("must be local (workers run jobs) or slurm (workers hand them to Slurm's sbatch)")
    return v


def _container_runtime(v: Any) -> str:
    if v not in RUNTIMES:
        raise ValueError(f"must be one of {', '.join(RUNTIMES)}")
    return v


def _clients(v: Any) -> dict[str, str]:
    if v is None:
        return {}
    if not isinstance(v, dict) or not all(
        k in RUNTIMES and isinstance(x, str) and x.startswith("/") and "\0" not in x for k, x in v.items()
    ):
        raise ValueError(
            f"must map runtimes ({', '.join(RUNTIMES)}) to their clients' absolute paths, "
            "e.g. {podman: /usr/bin/podman}"
        )
    return dict(v)


def _client_env(v: Any) -> dict[str, str]:
    if v is None:
        return {}
    if not isinstance(v, dict) or not all(
        isinstance(k, str) and k and "=" not in k and "\0" not in k and isinstance(x, str) and "\0" not in x
        for k, x in v.items()
    ):
        raise ValueError("must map variable names to strings, e.g. {DOCKER_HOST: 'unix:///run/docker.sock'}")
    return dict(v)


def _gpu_sharing(v: Any) -> str:
    if v not in GPU_SHARING:
        raise ValueError(
            "must be time-slicing (the driver's default) or mps (jobs that share a GPU run under NVIDIA MPS)"
        )
    return v


def _slurm_gpu_mem(v: Any) -> str:
    if v not in ("comment", "constraint", "shards"):
        raise ValueError("must be comment, constraint (with slurm_gpu_types) or shards (with slurm_shard_mib)")
    return v


def _gpu_types(v: Any) -> dict[str, int]:
    if v is None:
        return {}
    if not isinstance(v, dict) or not all(isinstance(k, str) and isinstance(x, str) for k, x in v.items()):
        raise ValueError("must map Slurm node features to GPU memory, e.g. {a10: 24GiB, a100: 80GiB}")
    return {k: parse_size_mib(x) for k, x in v.items()}


def _windows(v: Any) -> tuple:
    if v is None:
        return ()
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list):
        raise ValueError('must be a list of windows, e.g. ["22:00-08:00", Sat-Sun]')
    return tuple(parse_window(w) for w in v)


KEYS: dict[str, tuple[str, Any]] = {
    "poll_interval": ("poll_interval", _seconds),
    "gpu_mem_reserve": ("gpu_mem_reserve_mib", _size),
    "max_jobs_per_gpu": ("max_jobs_per_gpu", _positive(int)),
    "gpus": ("gpus", _gpu_map),
    "local_dir": ("local_dir", _optional_path),
    "cpu_slots": ("cpu_slots", _non_negative_int),
    "spec_settle_s": ("spec_settle_s", _seconds),
    "grace_s": ("grace_s", _seconds),
    "queue_lock_timeout_s": ("queue_lock_timeout_s", _seconds),
    "request_timeout_s": ("request_timeout_s", _seconds),
    "recent_finished": ("recent_finished", _non_negative_int),
    "lost_after_s": ("lost_after_s", _seconds),
    "lost_retries": ("lost_retries", _non_negative_int),
    "run_for_users": ("run_for_users", _user_names),
    "admins": ("admins", _user_names),
    "max_pending_per_user": ("max_pending_per_user", _positive(int)),
    "max_pending_size_per_user": ("max_pending_size_per_user_mib", _size),
    "max_booked_gpu_hours": ("max_booked_gpu_hours", _positive(float)),
    "allow_root_jobs": ("allow_root_jobs", _bool),
    "time_limit": ("time_limit_s", _optional_duration),
    "cpus": ("cpus", _optional_positive_int),
    "mem": ("mem_mib", _optional_size),
    "gpu_mem_overuse": ("gpu_mem_overuse", _overuse_action),
    "gpu_mem_tolerance_pct": ("gpu_mem_tolerance_pct", _percent),
    "gpu_mem_overuse_after_s": ("gpu_mem_overuse_after_s", _seconds),
    "metrics_dir": ("metrics_dir", _optional_path),
    "sample_every_s": ("sample_every_s", _seconds),
    "alert_command": ("alert_command", _optional_command),
    "alert_wait_s": ("alert_wait_s", _seconds),
    "alert_idle_holder_s": ("alert_idle_holder_s", _seconds),
    "alert_idle_util_pct": ("alert_idle_util_pct", _percent),
    "alert_gpu_temp_c": ("alert_gpu_temp_c", _positive(int)),
    "alert_gpu_power_w": ("alert_gpu_power_w", _optional_positive_float),
    "alert_worker_silent_s": ("alert_worker_silent_s", _seconds),
    "alert_short_jobs": ("alert_short_jobs", _positive(int)),
    "retry_on_oom": ("retry_on_oom", _non_negative_int),
    "shell_idle_timeout": ("shell_idle_timeout_s", _positive_duration),
    "max_gpus_per_user": ("max_gpus_per_user", _optional_positive_int),
    "fair_share": ("fair_share", _bool),
    "fair_share_half_life": ("fair_share_half_life_s", _positive_duration),
    "age_step_s": ("age_step_s", _seconds),
    "reserve_after_s": ("reserve_after_s", _non_negative_seconds),
    "reservations": ("reservations", _bool),
    "spread": ("spread", _bool),
    "fragmentation_aware": ("fragmentation_aware", _bool),
    "preemption": ("preemption", _bool),
    "gpu_sharing": ("gpu_sharing", _gpu_sharing),
    "idle_util_pct": ("idle_util_pct", _percent),
    "idle_after_s": ("idle_after_s", _seconds),
    "idle_windows": ("idle_windows", _windows),
    "backend": ("backend", _backend),
    "container_runtime": ("container_runtime", _container_runtime),
    "container_clients": ("container_clients", _clients),
    "container_env": ("container_env", _client_env),
    "allow_docker": ("allow_docker", _bool),
    "slurm_partitions": ("slurm_partitions", _class_map),
    "slurm_qos": ("slurm_qos", _class_map),
    "slurm_gpu_mem": ("slurm_gpu_mem", _slurm_gpu_mem),
    "slurm_gpu_types": ("slurm_gpu_types", _gpu_types),
    "slurm_shard_mib": ("slurm_shard_mib", _optional_size),
    "slurm_jobcomp_file": ("slurm_jobcomp_file", _optional_path),
}
# Keys only an extra reads (gpuq/extras/NAME/), each with that extra. They stay valid without
# it (a config outlives a deleted folder): a worker and `doctor` say that one set goes unused.
KEYS_OF_EXTRAS: dict[str, str] = {
    "metrics_dir": "reports",
    "sample_every_s": "reports",
    "max_booked_gpu_hours": "bookings",
    "container_runtime": "containers",
    "container_clients": "containers",
    "container_env": "containers",
    "allow_docker": "containers",
    "gpu_sharing": "mps",
    "alert_command": "alerts",
    "alert_wait_s": "alerts",
    "alert_idle_holder_s": "alerts",
    "alert_gpu_temp_c": "alerts",
    "alert_gpu_power_w": "alerts",
    "alert_worker_silent_s": "alerts",
    "alert_short_jobs": "alerts",
    "retry_on_oom": "oom",
    "shell_idle_timeout": "interactive",
}


def extras_settings(config: Config) -> dict[str, Any]:
    """The values of the config keys only extras read, by Config attribute: what a worker hands
    its supervisors (run/joblocal.py Runtime.settings), where the extras' launch wrappers read them."""
    return {KEYS[key][0]: getattr(config, KEYS[key][0]) for key in KEYS_OF_EXTRAS}


# Supervisors stop their jobs once their host's heartbeat is FENCE_FRACTION of lost_after_s
# old, and need grace_s more: that must end before other hosts may take the jobs over.
FENCE_FRACTION = 0.6
RECORD_FENCE_FRACTION = 0.9  # a finished job's result is still written up to this age


def validate(data: Any, file: str, problems: list[str] | None = None) -> Config:
    """Mapping from config.yaml -> Config; unknown keys and bad values name the fix. With
    `problems`, nothing is raised: each problem is added there and its key keeps its default
    (for those who only read the queue: a typo of the admin's must not blind the team)."""

    def refuse(message: str) -> None:
        if problems is None:
            raise ConfigError(message)
        problems.append(message)

    if data is None:
        return Config()
    if not isinstance(data, dict):
        refuse(f"{file}: must be a mapping of keys; see the comments in the shipped config.yaml")
        return Config()
    values: dict[str, Any] = {}
    for key, raw in data.items():
        if key not in KEYS:
            refuse(f"{file}: unknown key '{key}'. Fix: remove it or use one of: {', '.join(KEYS)}")
            continue
        attr, parse = KEYS[key]
        if raw is None:
            continue  # an empty value means "the default"
        try:
            values[attr] = parse(raw)
        except ValueError as e:
            refuse(f"{file}: key '{key}': {raw!r} {e}")
    config = replace(Config(), **values)
    if config.lost_after_s * (1 - FENCE_FRACTION) < 2 * config.grace_s:
        refuse(
            f"{file}: key 'lost_after_s': {config.lost_after_s:g} is too short for grace_s "
            f"{config.grace_s:g}: a host's jobs must be stopped before others take them "
            f"over. Fix: set lost_after_s to at least {5 * config.grace_s:g}"
        )
        config = replace(config, lost_after_s=Config().lost_after_s, grace_s=Config().grace_s)
    return config


def load(path: Path, problems: list[str] | None = None) -> Config:
    """Read config.yaml (absent = all defaults). With `problems`, as `validate`: what is wrong
    is added there, and the defaults stand in for it."""
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return Config()
    except OSError as e:
        message = f"{path}: cannot read ({e.strerror}). Fix: make it readable by the worker"
        if problems is None:
            raise ConfigError(message) from None
        problems.append(message)
        return Config()
    try:
        data = load_yaml(text, str(path))
    except SpecError as e:
        where = f"{path}: key '{e.field}'" if e.field else str(path)  # as the other config errors name it
        if problems is None:
            raise ConfigError(f"{where}: {e.problem}. Fix: {e.fix}") from None
        problems.append(f"{where}: {e.problem}. Fix: {e.fix}")
        return Config()
    return validate(data, str(path), problems)


def documented_keys() -> list[str]:
    return list(KEYS)


assert {a for a, _ in KEYS.values()} == {f.name for f in fields(Config)}
