"""Where everything lives under the queue's root (see docs/design.md, "The spool is the state").

Every path gpuq touches is computed here from the root; none is taken from a spec.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from gpuq.hooks import STATE_OF_EXTRAS
from gpuq.host.rootorders import root_started
from gpuq.single_instance import default_local_dir

ROOT_ENV = "GPUQ_ROOT"


class RootError(Exception):
    """The queue's root cannot be found or is not a gpuq root."""


def resolve_root(cli_root: str | None, launcher_dir: str | None) -> Path:
    """--root DIR > $GPUQ_ROOT > the directory holding gpuq.py/worker.py (or, for the
    installed entry points, the current directory when it looks like a root)."""
    for candidate in (cli_root, os.environ.get(ROOT_ENV), launcher_dir):
        if candidate:
            return Path(candidate).resolve()
    cwd = Path.cwd()
    if (cwd / "jobs").is_dir() and (cwd / "config.yaml").exists():
        return cwd
    raise RootError(
        "no queue root: pass --root DIR, set GPUQ_ROOT=DIR, or run from a directory holding config.yaml and jobs/"
    )


def job_id_for_spec_name(filename: str) -> str | None:
    """`train-a.yaml` -> `train-a`; None for names that are not specs (dotfiles, *.tmp, *~, ...)."""
    if filename[0] == ".":
        return None
    if filename.endswith(".yaml"):
        return filename[:-5]
    if filename.endswith(".yml"):
        return filename[:-4]
    return None


@dataclass(frozen=True)
class Layout:
    """The directory tree of one queue root."""

    root: Path

    @cached_property
    def config_file(self) -> Path:
        return self.root / "config.yaml"

    @cached_property
    def jobs(self) -> Path:
        return self.root / "jobs"

    @cached_property
    def logs(self) -> Path:
        return self.root / "logs"

    @cached_property
    def worker_logs(self) -> Path:
        """The workers' own logs: a directory of the queue account's, so that no job's log
        (logs/ID.log, in logs/ itself) can take a worker's name."""
        return self.logs / "workers"

    @cached_property
    def state(self) -> Path:
        return self.root / "state"

    @cached_property
    def requests(self) -> Path:
        """The sticky inbox: the one place besides jobs/ where team members create files
        (requests.py). Everything else under the root is the worker's account's."""
        return self.root / "requests"

    @cached_property
    def taken_requests(self) -> Path:
        """Requests a worker has taken out of the inbox (by rename: exactly one applies each)."""
        return self.state / "requests"

    @cached_property
    def replies(self) -> Path:
        """One reply per applied request, read by the CLI that sent it."""
        return self.state / "replies"

    @cached_property
    def claims(self) -> Path:
        return self.state / "claims"

    @cached_property
    def running(self) -> Path:
        return self.state / "running"

    @cached_property
    def finished(self) -> Path:
        return self.state / "finished"

    @cached_property
    def rejected(self) -> Path:
        return self.state / "rejected"

    @cached_property
    def held(self) -> Path:
        return self.state / "held"

    @cached_property
    def requeued(self) -> Path:
        """The last record of each job that went back to pending: its next attempt is +1."""
        return self.state / "requeued"

    @cached_property
    def places(self) -> Path:
        """The queue place a worker kept for a job it put back (released, requeued)."""
        return self.state / "places"

    @cached_property
    def workers(self) -> Path:
        return self.state / "workers"

    @cached_property
    def control(self) -> Path:
        return self.state / "control"

    @cached_property
    def events(self) -> Path:
        return self.state / "events"

    @cached_property
    def samples(self) -> Path:
        return self.state / "samples"

    @cached_property
    def groups(self) -> Path:
        """Sweeps and arrays (spool/sweeps.py)."""
        return self.state / "groups"

    @cached_property
    def ids(self) -> Path:
        """One reservation per accepted job id: whose it is (spool/ids.py)."""
        return self.state / "ids"

    @cached_property
    def drains(self) -> Path:
        """One file per drained host (spool/drain.py)."""
        return self.state / "drain"

    @cached_property
    def queue_lock(self) -> Path:
        return self.state / "queue.lock"

    def ensure(self) -> None:
        """Create the spool directories (idempotent; safe for concurrent callers)."""
        for d in self.directories():
            if self.state in d.parents:
                self.make_state_dir(d)
            else:
                d.mkdir(parents=True, exist_ok=True)

    def make_state_dir(self, path: Path) -> None:
        """A directory under state/ where it is missing (a queue from before it existed), with
        state/'s own mode and never the umask's: only the queue's account writes under state/,
        and a worker started with umask 002 made state/ids group-writable, where a member could
        rename one reservation over another. Made private first: no moment others may write it."""
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            return
        os.chmod(path, stat.S_IMODE(os.stat(self.state).st_mode) & ~0o022)

    def directories(self) -> tuple[Path, ...]:
        """Every directory of the spool, parents first."""
        return (
            self.jobs,
            self.requests,
            self.logs,
            self.worker_logs,
            self.state,
            self.claims,
            self.running,
            self.finished,
            self.rejected,
            self.held,
            self.requeued,
            self.places,
            self.workers,
            self.control,
            self.events,
            self.samples,
            self.groups,
            self.ids,
            self.drains,
            self.taken_requests,
            self.replies,
            self.state / "metrics",
            # The extras' own (hooks.py STATE_OF_EXTRAS), made whether or not the extra is here:
            # root-owned like the rest of state/, never made later by whoever writes first.
            *(self.state / name for name in STATE_OF_EXTRAS),
        )

    def member_writable(self) -> tuple[Path, ...]:
        """The two sticky inboxes team members create files in (docs/security.md)."""
        return (self.jobs, self.requests)

    def job_log(self, job_id: str) -> Path:
        return self.logs / f"{job_id}.log"

    def worker_log(self, host: str) -> Path:
        return self.worker_logs / f"{host}.log"

    def record(self, directory: Path, job_id: str) -> Path:
        return directory / f"{job_id}.json"

    def heartbeat(self, host: str) -> Path:
        return self.workers / f"{host}.json"

    def spec_cache(self, host: str) -> Path:
        return self.workers / f"{host}.specs.json"

    def usage_cache(self, host: str) -> Path:
        """Each user's decayed usage as that host's worker last counted it (for `gpuq status`).
        Not `.json`: every `<host>.json` in state/workers/ is read as a heartbeat."""
        return self.workers / f"{host}.usage"

    def host_control(self, host: str) -> Path:
        return self.control / host

    def host_events(self, host: str) -> Path:
        return self.events / f"{host}.jsonl"

    def default_local_dir(self, host: str) -> Path:
        return Path(default_local_dir(str(self.root), host, root_started()))

    def local_dir(self, host: str, setting: str | None) -> Path:
        """The host's local lock directory: config `local_dir` with `{host}` replaced, else the default."""
        if setting:
            return Path(setting.replace("{host}", host))
        return self.default_local_dir(host)
