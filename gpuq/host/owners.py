"""Who may have what run, and as whom (docs/security.md, "As whom a job runs").

A spec's owner is the owner of its file, checked on the open file: nothing written inside a
spec says who it is. A queue whose root part is root (cron starts it as root) runs each job
as its spec's owner; a worker started by a plain user runs only that user's specs, and those
of the users config lists in `run_for_users` (as itself, on their behalf). Specs owned by
root are refused, so that nothing runs as root; so are specs of the queue's own account in a
team queue, and specs others could have edited.
"""

from __future__ import annotations

import os
import pwd
import stat
from dataclasses import dataclass
from typing import Protocol

from gpuq.host import wire
from gpuq.host.privsep import regular_uid
from gpuq.model.errors import SpecError


@dataclass(frozen=True)
class Identity(wire.Identity):
    """Whom a job runs as: what the root part checks (host/wire.py), and the home a job starts in."""

    home: str

    @classmethod
    def of(cls, uid: int) -> "Identity":
        pw = pwd.getpwuid(uid)  # KeyError: no such user
        return cls(uid, pw.pw_gid, tuple(os.getgrouplist(pw.pw_name, pw.pw_gid)), pw.pw_name, pw.pw_dir)

    def environment(self) -> dict[str, str]:
        return {"HOME": self.home, "USER": self.name, "LOGNAME": self.name}


class FileOwnership(Protocol):
    """What OwnerPolicy.check reads of a file's stat: an os.stat_result, or a stand-in."""

    @property
    def st_uid(self) -> int: ...

    @property
    def st_mode(self) -> int: ...


@dataclass(frozen=True)
class OwnerPolicy:
    worker_uid: int
    run_for_uids: frozenset[int]  # besides the worker's own user (a non-root worker)
    shared_root: bool  # jobs/ is writable by others than its owner
    allow_root: bool = False  # config allow_root_jobs
    as_owners: bool = False  # the root part runs each job as its spec's owner (host/privsep.py)
    admins: frozenset[int] = frozenset()  # config admins: who may rank jobs above normal

    @classmethod
    def for_worker(
        cls,
        jobs_dir_mode: int,
        run_for_users: tuple[str, ...],
        allow_root: bool = False,
        as_owners: bool = False,
        admins: tuple[str, ...] = (),
    ) -> "OwnerPolicy":
        shared = writable_by_others(jobs_dir_mode)
        return cls(
            os.geteuid(),
            uids_of(run_for_users),
            shared,
            allow_root,
            as_owners or os.geteuid() == 0,
            uids_of(admins) | {0, os.geteuid()},
        )

    def check_rank(self, owner_uid: int, priority_class: str, priority: int, display: str) -> None:
        """Raise SpecError when a member who is not an admin ranks a job above everyone's:
        `priority: high`, or an integer above 0 (normal's), would put it before fair share
        and let it preempt others' jobs (docs/scheduling.md)."""
        if owner_uid in self.admins or (priority_class != "high" and priority <= 0):
            return
        asked = "high" if priority_class == "high" else str(priority)
        raise SpecError(
            display,
            "priority",
            f"{asked} ranks this job above everyone's; only the queue's admins (config admins) may",
            "leave priority out (normal), or use low or a negative integer; ask an admin to raise it",
        )

    def check(self, st: FileOwnership, display: str) -> None:
        """Raise SpecError when this worker must not run a spec whose file is `st`."""
        team = self.as_owners and self.worker_uid != 0  # a queue account's worker, with a root part
        if st.st_uid == 0 and (team or not self.allow_root):
            raise SpecError(
                display,
                None,
                "is owned by root, and gpuq does not run jobs as root",
                "submit it as the user the job should run as"
                + ("" if team else " (or set allow_root_jobs: true in config.yaml where everything runs as root)"),
            )
        if team and st.st_uid == self.worker_uid:
            raise SpecError(
                display,
                None,
                f"is owned by {_name(st.st_uid)}, the queue's own account, which runs no jobs",
                "submit it as the user the job should run as",
            )
        if st.st_uid == self.worker_uid:
            pass
        elif self.as_owners:
            try:
                Identity.of(st.st_uid)
            except KeyError:
                raise SpecError(
                    display,
                    None,
                    f"is owned by uid {st.st_uid}, which has no account on this host",
                    "submit it as a user that exists on every GPU box",
                ) from None
            if team and not regular_uid(st.st_uid):
                raise SpecError(
                    display,
                    None,
                    f"is owned by {_name(st.st_uid)} (uid {st.st_uid}), a system account or nobody "
                    "(what an NFS client's root, squashed, or an unmapped uid shows as)",
                    "submit it as the member the job should run as, from a client that maps uids "
                    "(docs/security.md: Shared disks)",
                )
        elif st.st_uid != self.worker_uid and st.st_uid not in self.run_for_uids:
            raise SpecError(
                display,
                None,
                f"is owned by {_name(st.st_uid)}, and this worker runs as "
                f"{_name(self.worker_uid)}, which runs only its own specs",
                f"add {_name(st.st_uid)} to run_for_users in config.yaml, or run the "
                "worker as root so that each job runs as its owner",
            )
        if self.shared_root and writable_by_others(st.st_mode):
            raise SpecError(
                display,
                None,
                f"can be changed by other users (mode {stat.S_IMODE(st.st_mode):04o}) "
                "in a shared jobs/, and its command would run as you",
                "write a fresh copy yourself with mode 0644 (umask 022) and drop that into jobs/: "
                "a chmod does not take back a handle someone opened on this one",
            )


def uids_of(names: tuple[str, ...]) -> frozenset[int]:
    """The uids of the users named (a name this box does not know: nobody)."""
    found = set()
    for name in names:
        try:
            found.add(pwd.getpwnam(name).pw_uid)
        except KeyError:
            pass
    return frozenset(found)


def writable_by_others(mode: int) -> bool:
    """Group or others may write it (a spec file, or jobs/ itself: then the root is shared)."""
    return bool(mode & (stat.S_IWGRP | stat.S_IWOTH))


def others_may_write(spec_mode: int, jobs_dir_mode: int) -> bool:
    """Whether a member other than a spec's owner may have written it: the file is writable by
    others in a jobs/ others write too (alone, a umask of 002 harms nobody). OwnerPolicy.check
    refuses such a spec; a retry never puts one back (spool/holds.py)."""
    return writable_by_others(spec_mode) and writable_by_others(jobs_dir_mode)


def _name(uid: int) -> str:
    if uid < 0:  # spool/ids.py NOBODY: a reservation whose owner nobody can name
        return "a job whose owner is unknown"
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def refusal(job_id: str, owner_uid: int) -> str:
    """One sentence for every verb: the rule is the same for all (and `edit` sends a hold first,
    so a verb named here would not be the one the person typed)."""
    return f"{job_id}: belongs to {_name(owner_uid)}; only its owner, root or an admin (config `admins`) may change it"


@dataclass(frozen=True)
class Actor:
    """Who asks for a change: the owner of the request file (never a name written in it).
    Admins are root, the account the worker runs as (it owns the spool), and config `admins`."""

    uid: int
    name: str
    admin: bool

    @classmethod
    def of(cls, uid: int, admins: tuple[str, ...], by_root: bool = False) -> "Actor":
        """`by_root`: the request says root's gpuq sent it. Believed only of a file this
        process's own account owns (root's gpuq acts as the queue's account: only root and that
        account write as it), so a cancel by root says root, not the queue account's name."""
        name = "root" if by_root and uid == os.geteuid() else _name(uid)
        return cls(uid, name, uid in (0, os.geteuid()) or name in admins)

    def may_act_on(self, owner_uid: int) -> bool:
        return self.admin or self.uid == owner_uid
