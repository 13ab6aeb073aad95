"""Do the tests still have their power? Each mutant below switches one guarantee off in a
temporary copy of the checkout and runs the tests that should catch it; a mutant the tests
let live is a guarantee nobody checks any more.

`python -m tools.mutants` runs them all (a few minutes: some of the tests start workers);
`python -m tools.mutants fencing plan-fits` runs those. It prints one line per mutant:
killed (the tests failed, as they must) or SURVIVED, and exits 1 if any survived. The suite
itself does not run this (it would run the slow tests once per mutant); run it after
changing a test that guards one of these, or the code it guards.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutant:
    guarantee: str
    file: str  # relative to the checkout
    old: str  # must occur exactly once in `file`
    new: str
    tests: tuple[str, ...]  # pytest node ids or files, relative to the checkout


MUTANTS: dict[str, Mutant] = {
    "fencing": Mutant(
        "a supervisor whose host lost its lease, or whose job another host took over, stops its job",
        "gpuq/run/supervise.py",
        "def fence_reason(rt: Runtime, record: Record, lease_fraction: float = FENCE_FRACTION) -> str | None:\n",
        "def fence_reason(rt: Runtime, record: Record, lease_fraction: float = FENCE_FRACTION) -> str | None:\n"
        "    return None\n",
        (
            "tests/test_faults.py::test_a_frozen_host_is_taken_over_and_its_stale_copy_fenced",
            "tests/test_faults.py::test_a_host_that_cannot_renew_its_heartbeat_stops_its_jobs_before_takeover",
        ),
    ),
    "exactly-once-claim": Mutant(
        "a claim moves the spec out of jobs/, so no second worker can claim it",
        "gpuq/spool/store.py",
        "        os.rename(spec_path, dest)\n",
        "        os.link(spec_path, dest)\n",
        ("tests/test_worker_passes.py", "tests/test_team_passes.py"),
    ),
    "owner-from-fstat": Mutant(
        "a file is judged by the open file's owner, never by another user's file behind it",
        "gpuq/host/safefile.py",
        "        if owners is not None and st.st_uid not in owners:\n",
        "        if False:\n",
        ("tests/test_safefile.py", "tests/test_attacks_inbox.py"),
    ),
    "one-link": Mutant(
        "a spec hard-linked from someone else's file is not read as the linker's",
        "gpuq/host/safefile.py",
        "        if st.st_nlink != 1 and not (st.st_nlink == 2 and _writers_leftover(path, st))"
        " and os.fstat(fd).st_nlink != 1:\n",
        "        if False:\n",
        ("tests/test_safefile.py", "tests/test_intake.py"),
    ),
    "plan-fits-memory": Mutant(
        "the plan puts a job only where its declared memory is free",
        "gpuq/sched/placement.py",
        "    return free if free >= spec.gpu_mem_mib else None  # type: ignore[operator]\n",
        "    return free  # type: ignore[operator]\n",
        ("tests/test_plan.py",),
    ),
    "id-reservation": Mutant(
        "an id accepted for one member's job is never another member's (state/ids/ID read as its owner)",
        "gpuq/spool/ids.py",
        "    return _read(layout, job_id)[1] if complete(layout) else _legacy_holder(layout, job_id)\n",
        "    return None if complete(layout) else _legacy_holder(layout, job_id)\n",
        ("tests/test_ids.py",),
    ),
    "settle-any-end": Mutant(
        "a result the shared disk refused is recorded by the worker, whatever the end (a timeout too)",
        "gpuq/run/joblocal.py",
        "    if not state.is_final or state is State.REJECTED:  # a timeout is an end too\n",
        "    if state not in (State.DONE, State.FAILED, State.CANCELLED, State.LOST):\n",
        ("tests/test_worker_passes.py",),
    ),
    "state-transitions": Mutant(
        "a job's state changes only along the table of allowed transitions",
        "gpuq/model/states.py",
        "    if new not in ALLOWED[old]:\n",
        "    if False:\n",
        ("tests/test_state_changes.py",),
    ),
}


def _copy_checkout(into: Path) -> None:
    ignore = shutil.ignore_patterns(".git", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache", "build")
    shutil.copytree(CHECKOUT, into, ignore=ignore, symlinks=True)


def run(name: str, mutant: Mutant) -> bool:
    """Whether the tests killed the mutant (failed on it). Raises when its anchor is gone:
    the code moved, and the mutant must move with it."""
    with tempfile.TemporaryDirectory(prefix="gpuq-mutant-") as tmp:
        copy = Path(tmp) / "checkout"
        _copy_checkout(copy)
        target = copy / mutant.file
        text = target.read_text()
        if text.count(mutant.old) != 1:
            raise SystemExit(f"{name}: its anchor occurs {text.count(mutant.old)} times in {mutant.file}; move it")
        target.write_text(text.replace(mutant.old, mutant.new))
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *mutant.tests],
            cwd=copy,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        killed = done.returncode != 0
        print(
            f"{name:20} {'killed' if killed else 'SURVIVED'} in {time.monotonic() - started:5.0f} s: {mutant.guarantee}"
        )
        return killed


def baseline(tests: list[str]) -> bool:
    """Whether the tests pass on the checkout as it is: a mutant "killed" by tests that fail
    anyway proves nothing."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
        cwd=CHECKOUT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return done.returncode == 0


def main(argv: list[str]) -> int:
    names = argv or list(MUTANTS)
    unknown = [n for n in names if n not in MUTANTS]
    if unknown:
        print(f"no such mutant: {', '.join(unknown)}; there are: {', '.join(MUTANTS)}", file=sys.stderr)
        return 2
    tests = sorted({t for n in names for t in MUTANTS[n].tests})
    if not baseline(tests):
        print(f"the tests fail without any mutant; fix them first: {' '.join(tests)}", file=sys.stderr)
        return 2
    survived = [n for n in names if not run(n, MUTANTS[n])]  # an error counts as survived: look
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
