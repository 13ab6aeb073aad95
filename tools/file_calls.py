"""Every raw call that opens, renames or links a path in gpuq, outside the two modules whose
job that is (host/safefile.py: reading a file others may have written; host/files.py: writing
and creating files under a directory descriptor), each either provably not following a link
or reviewed here with the reason it is safe.

A worker runs as the queue's account and its root part as root, and members can plant names
(links, FIFOs, hard links, other users' files) in jobs/ and requests/: a raw open of such a
name, or of a path under a directory others can write, is how a privileged process is made to
write or read someone else's file. So a new raw call fails tests/test_file_calls.py until it
goes through safefile/files or is added to REVIEWED with its reason (and a reviewer agrees).

`python -m tools.file_calls` prints every raw call and how it is judged.
"""

from __future__ import annotations

import ast
import functools
import sys
from dataclasses import dataclass
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "gpuq"
MECHANISM = frozenset({"gpuq.host.safefile", "gpuq.host.files"})  # the modules whose job it is
CALLS = frozenset({"open", "rename", "replace", "link", "symlink", "mkfifo", "mknod"})  # os.<name>

_RENAME = "rename(2) moves a link or a FIFO itself, never what it points to"
_DEVNULL = "opens os.devnull"
_LOCAL = "a file in the box's local directory, private to the queue's account (hostinfo.ensure_private_dir)"
_STATE = "a file under state/, which only the queue's account may write (2750)"

# (module, function, call) -> why this raw call is safe.
REVIEWED: dict[tuple[str, str, str], str] = {
    ("gpuq.worker.stopping", "StopOrders.obey_controls", "rename"): _STATE + " (state/control/HOST/); " + _RENAME,
    ("gpuq.worker.stopping", "_put_back", "link"): _STATE + " (state/control/HOST/): a taken order linked back",
    ("gpuq.host.audit", "_write", "open"): "the tests' audit log, named by the test's environment (never set in use)",
    ("gpuq.host.faults", "_fired", "open"): "the tests' fault log, named by the test's environment (never set in use)",
    ("gpuq.host.keeper", "_job", "open"): _DEVNULL,
    ("gpuq.host.privsep", "_run_root", "open"): _DEVNULL,
    ("gpuq.run.supervise", "become_supervisor", "open"): _DEVNULL,
    ("gpuq.worker_main", "_daemonize", "open"): _DEVNULL,
    ("gpuq.host.rootorders", "place", "open"): "the two directories of a link root makes (O_DIRECTORY): jobs/ and "
    "state/ under the queue root, whose path the admin set",
    ("gpuq.run.launch", "start_run", "open"): "logs/ itself (O_DIRECTORY), handed to root's keeper, which opens the "
    "job's log in it as the job's owner with O_NOFOLLOW",
    ("gpuq.extras.notify.sentmarks", "open_folder", "open"): "the member's own HOME, as the member (the deliverer "
    "runs as the job's owner, HOME from the account), which may be a link (/home on another disk); it is checked "
    "to be theirs or root's and writable by nobody else, and every level below is opened without following a link",
    ("gpuq.host.wake", "poke", "open"): _LOCAL + "; O_NONBLOCK: a FIFO nobody reads never blocks",
    ("gpuq.host.wake", "WakeFifo.__init__", "mkfifo"): _LOCAL,
    ("gpuq.host.wake", "WakeFifo.__init__", "open"): _LOCAL,
    ("gpuq.run.joblocal", "open_lease", "open"): _LOCAL,
    ("gpuq.extras.reports.samples", "SampleLog.flush", "open"): _STATE,
    ("gpuq.spool.store", "append_event", "open"): _STATE,
    ("gpuq.spool.cancel", "cancel_pending", "rename"): _RENAME + "; a pending spec out of jobs/ into state/",
    ("gpuq.spool.holds", "edit", "rename"): _RENAME + "; within state/",
    ("gpuq.spool.holds", "_set_aside_intruders", "rename"): _RENAME
    + "; another member's file under a reserved id, out of jobs/ into state/rejected/",
    ("gpuq.spool.inbox", "send", "rename"): _RENAME + "; the member's own request, in the sticky requests/",
    ("gpuq.spool.inbox", "take", "rename"): _RENAME + "; a request out of requests/, read then with safefile",
    ("gpuq.spool.store", "claim", "rename"): _RENAME + "; a spec out of jobs/, read then with safefile",
    ("gpuq.spool.store", "move_new", "rename"): _RENAME + "; within state/",
    ("gpuq.spool.store", "put_back", "rename"): _RENAME + "; a spec that lost its name in jobs/, into state/rejected/",
    ("gpuq.spool.store", "unclaim", "link"): "link(2) never follows the link it is given (AT_SYMLINK_FOLLOW unset); "
    "never over a name there",
    ("gpuq.spool.submit", "place_spec", "link"): "the member's own temp file, linked to the first free name in jobs/",
    ("gpuq.spool.sweeps", "expand_dropped_sweep", "rename"): _RENAME + "; a sweep's spec out of jobs/",
    ("gpuq.worker.recovery", "Recovery._hold_spec", "rename"): _RENAME + "; a claim within state/",
    ("gpuq.worker.recovery", "Recovery.requeue", "rename"): _RENAME
    + "; a retry's new spec over the held claim, within state/",
    ("gpuq.worker.returns", "_park", "rename"): _RENAME + "; a claim within state/claims/",
    ("gpuq.worker.returns", "reject", "rename"): _RENAME + "; a refused spec out of jobs/ into state/rejected/",
}


@dataclass(frozen=True)
class RawCall:
    module: str
    function: str  # "Class.method", "function", or "" at module level
    call: str  # the os function
    line: int
    no_follow: bool  # provably: O_NOFOLLOW in its flags, or follow_symlinks=False

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.module, self.function, self.call)


def _flags_name_no_follow(function: ast.AST | None, name: str, src: str) -> bool:
    """Whether `name`, assigned in `function`, holds O_NOFOLLOW (flags = os.O_... | os.O_NOFOLLOW)."""
    if function is None:
        return False
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            if "O_NOFOLLOW" in (ast.get_source_segment(src, node.value) or ""):
                return True
    return False


def _no_follow(call: ast.Call, function: ast.AST | None, src: str) -> bool:
    segment = ast.get_source_segment(src, call) or ""
    if "O_NOFOLLOW" in segment or "follow_symlinks=False" in segment:
        return True
    names = {n.id for arg in call.args[1:2] for n in ast.walk(arg) if isinstance(n, ast.Name)}
    return any(_flags_name_no_follow(function, name, src) for name in names)


def raw_calls(package_dir: Path = PACKAGE_DIR) -> list[RawCall]:
    found: list[RawCall] = []
    for path in sorted(package_dir.rglob("*.py")):
        rel = path.relative_to(package_dir)
        if "tests" in rel.parts:
            continue
        module = ".".join(("gpuq", *rel.with_suffix("").parts)).removesuffix(".__init__")
        if module in MECHANISM:
            continue
        found += _calls_in(module, path.read_text())
    return found


@functools.lru_cache(maxsize=None)
def _calls_in(module: str, src: str) -> tuple[RawCall, ...]:
    """Once per process for each text (two tests ask for the whole package's calls)."""
    found: list[RawCall] = []
    _visit(ast.parse(src), "", None, module, src, found)
    return tuple(found)


def _visit(node: ast.AST, name: str, function: ast.AST | None, module: str, src: str, found: list[RawCall]) -> None:
    for child in ast.iter_child_nodes(node):
        inner, scope = name, function
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            inner = f"{name}.{child.name}" if name else child.name
            scope = child if not isinstance(child, ast.ClassDef) else function
        if (
            isinstance(child, ast.Call)
            and isinstance(child.func, ast.Attribute)
            and isinstance(child.func.value, ast.Name)
            and child.func.value.id == "os"
            and child.func.attr in CALLS
        ):
            found.append(RawCall(module, name, child.func.attr, child.lineno, _no_follow(child, function, src)))
        _visit(child, inner, scope, module, src, found)


def unreviewed(calls: list[RawCall]) -> list[RawCall]:
    """The raw calls that neither provably follow no link nor were reviewed."""
    return [c for c in calls if not c.no_follow and c.key not in REVIEWED]


def main() -> int:
    for call in raw_calls():
        how = "no link followed" if call.no_follow else REVIEWED.get(call.key, "NOT REVIEWED")
        print(f"{call.module}:{call.line} {call.function} os.{call.call}: {how}")
    return 1 if unreviewed(raw_calls()) else 0


if __name__ == "__main__":
    sys.exit(main())
