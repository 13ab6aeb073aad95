"""`gpuq doctor`: what stands between this queue and a working team, each finding with the
command that fixes it. Checks NVML and the driver here, the GPUs each host offers, the
root's permissions, that the local lock directory is local, the root's file system and NFS
mount options and whether the export squashes root, that config, code and state are safe from
the team and the interpreter reachable by it, clock offsets between hosts (from their
heartbeats), that cron starts a worker for this root (for a member: that workers are up), and
that every host runs this gpuq version."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from gpuq import __version__, hooks
from gpuq.cli.initroot import cron_line
from gpuq.host.hostinfo import NETWORK_FILESYSTEMS, mount_of
from gpuq.host.owners import writable_by_others
from gpuq.model.config import Config
from gpuq.single_instance import this_host
from gpuq.spool import strictmodes
from gpuq.spool.layout import Layout
from gpuq.spool.teamstate import heartbeat_alive, load_heartbeats

CLOCK_WARN_S = 1.0  # heartbeat time vs the file's mtime, across hosts


@dataclass
class Finding:
    level: str  # ok, warn, fail
    check: str
    message: str
    fix: str = ""


def runs_the_workers(layout: Layout) -> bool:
    """Whether whoever runs doctor is the account that runs this root's workers (root, or
    the one user of a private queue): only they are told to start or fix a worker; a member
    is told whom to ask (newcomer review M9: a member who followed the advice made a phantom host)."""
    return os.geteuid() in (0, _owner(layout.state))


ASK_THE_OWNER = (
    "ask the root's owner to check cron and logs/workers/HOST.log on the GPU boxes (gpuq doctor, run as them)"
)


def check_nvml(layout: Layout) -> Finding:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            driver = pynvml.nvmlSystemGetDriverVersion()
            count = pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
    except Exception as e:  # NVMLError, ImportError, a missing libnvidia-ml.so: all the same here
        if not runs_the_workers(layout):  # a member's laptop or login box needs no GPU to use the queue
            return Finding(
                "ok",
                "nvml",
                f"NVML is not usable on {this_host()} ({e}); the workers' boxes report their own GPUs (hosts)",
            )
        return Finding(
            "warn",
            "nvml",
            f"NVML is not usable on {this_host()}: {e}",
            "on a GPU box: install the NVIDIA driver until `nvidia-smi` works; without "
            "GPUs, run workers with --fake-gpus 4x24GiB",
        )
    driver = driver.decode() if isinstance(driver, bytes) else driver
    return Finding("ok", "nvml", f"NVML works on {this_host()}: driver {driver}, {count} GPU(s)")


def check_hosts(layout: Layout, config: Config, now: float) -> list[Finding]:
    beats = load_heartbeats(layout)
    owner = runs_the_workers(layout)
    if not beats:
        return [
            Finding(
                "fail",
                "hosts",
                "no worker has ever run for this root",
                f"add to each box's crontab: {cron_line(layout.root)}" if owner else ASK_THE_OWNER,
            )
        ]
    out = []
    for hb in beats:
        host, gpus = hb["host"], hb.get("gpus", [])
        offered = config.offered_gpus(host)
        what = f"{len(gpus)} GPU(s)" + (f" (config gpus: {offered})" if offered is not None else "")
        if hb.get("stopped"):  # it said so as it stopped: not silent, and not a fault by itself
            out.append(
                Finding(
                    "warn",
                    "hosts",
                    f"{host}: its worker stopped cleanly ({what}); cron starts it "
                    "again within a minute if its crontab line is there",
                    f"on {host}: check its crontab" if owner else ASK_THE_OWNER.replace("HOST", host),
                )
            )
        elif not heartbeat_alive(hb, now):
            out.append(
                Finding(
                    "warn",
                    "hosts",
                    f"{host}: worker silent for {now - hb.get('t', 0):.0f} s ({what})",
                    f"on {host}: check its crontab and logs/workers/{host}.log"
                    if owner
                    else ASK_THE_OWNER.replace("HOST", host),
                )
            )
        elif hb.get("probe_error"):
            out.append(Finding("warn", "hosts", f"{host}: {hb['probe_error']}", f"on {host}: run `nvidia-smi`"))
        else:
            out.append(Finding("ok", "hosts", f"{host}: up, offers {what}"))
        for runtime, why in sorted(hb.get("runtime_problems", {}).items()):
            out.append(
                Finding(
                    "warn",
                    "containers",
                    f"{host}: {runtime} is installed but unusable: {why}; "
                    "jobs needing it are not placed there meanwhile",
                    f"on {host}: start its daemon (`systemctl start {runtime}`) or check `{runtime} version`"
                    if owner
                    else f"if your jobs need {runtime}, ask the root's owner",
                )
            )
        if hb.get("runtimes"):
            found = ", ".join(f"{n} {v}" for n, v in sorted(hb["runtimes"].items()))
            out.append(Finding("ok", "containers", f"{host}: {found}"))
        if not hb.get("stopped") and heartbeat_alive(hb, now):
            out += _extras_findings(host, hb, config, owner)
        if hb.get("version") != __version__:
            out.append(
                Finding(
                    "fail",
                    "version",
                    f"{host} runs gpuq {hb.get('version')}, this is {__version__}",
                    f"on {host}: update its checkout (git pull; pip install -e .) so every box runs one version",
                )
            )
    return out


def _extras_findings(host: str, hb: dict, config: Config, owner: bool) -> list[Finding]:
    """What the extras' doctor checks say of a live box (gpuq/hooks.py DoctorCheck: the mps
    extra's MPS). One that fails is a warning; the others still run."""
    out: list[Finding] = []
    for check in hooks.registry().doctor_checks:
        try:
            out += hooks.load(check.check)(host, hb, config, owner)
        except Exception as e:  # an extra's code: whatever it raises, doctor goes on
            out.append(
                Finding(
                    "warn",
                    "extras",
                    f"{host}: the extras' check {check.name} ({check.check}) failed: {type(e).__name__}: {e}",
                    "report it; meanwhile that check says nothing",
                )
            )
    return out


def fix_on(host: str, owner: bool, fix: str) -> str:
    """A fix for a box: the root's owner does it there; a member asks them."""
    return f"on {host}: {fix}" if owner else f"ask the root's owner to look at {host}: {fix}"


def check_permissions(layout: Layout) -> list[Finding]:
    """The trust boundary (docs/security.md): members create files only in jobs/ and
    requests/ (sticky where shared); everything else is the spool owner's and nobody else can
    write it; a root worker refuses to start otherwise (spool/strictmodes.py)."""
    out = []
    for d in layout.member_writable():
        try:
            mode = os.stat(d).st_mode
        except FileNotFoundError:
            out.append(
                Finding(
                    "fail",
                    "permissions",
                    f"{d} is missing (a root made by an older gpuq)",
                    f"as the root's owner: mkdir {d}; chmod --reference={layout.jobs} {d}",
                )
            )
            continue
        if mode & (stat.S_IWGRP | stat.S_IWOTH) and not mode & stat.S_ISVTX:
            out.append(
                Finding(
                    "fail",
                    "permissions",
                    f"{d} is writable by others but not sticky: anyone could rename or delete another user's file",
                    f"chmod +t {d}",
                )
            )
        elif not os.access(d, os.W_OK):
            out.append(
                Finding(
                    "fail",
                    "permissions",
                    f"{d} is not writable by you",
                    "ask the root's owner to put you in the queue's group (docs/security.md, Setting up a shared root)",
                )
            )
    # Root checks for a root worker (which must own the spool); anyone else for the account
    # that owns state/ (a user's own queue, or the root worker's as a member sees it).
    owner = _owner(layout.state)
    worker_uid = os.geteuid() if os.geteuid() == 0 or owner is None else owner
    for problem in strictmodes.problems(layout, worker_uid):
        out.append(
            Finding(
                "fail",
                "permissions",
                problem.split("; ")[0] + "; a root worker refuses to start",
                problem.rsplit("Fix: ", 1)[-1],
            )
        )
    return out or [
        Finding(
            "ok",
            "permissions",
            "members write only jobs/ and requests/ (sticky); config, "
            "code, logs/ and state/ are the worker's account's",
        )
    ]


def check_reachable(layout: Layout) -> list[Finding]:
    """Members run the same gpuq: the interpreter and the code must be reachable by them (a
    venv under an admin's 0700 home is not; newcomer review M10)."""
    team_gid = os.stat(layout.root).st_gid
    out = []
    for what, path in (("the Python gpuq runs on", Path(sys.executable)), ("gpuq's code", Path(__file__))):
        blocked = _blocked_for_team(path.resolve(), team_gid)
        if blocked is not None:
            out.append(
                Finding(
                    "warn",
                    "reachable",
                    f"{what} ({path}) is not reachable by the team: {blocked} lets only its owner in",
                    "make a venv everyone can run, e.g. "
                    "`/usr/bin/python3 -m venv /opt/gpuq-venv && /opt/gpuq-venv/bin/pip install "
                    "/path/to/gpuq` (docs/security.md, Setting up a shared root)",
                )
            )
    return out or [Finding("ok", "reachable", f"the team can run this gpuq ({sys.executable})")]


def _blocked_for_team(path: Path, team_gid: int) -> Path | None:
    for d in reversed(path.parents):
        try:
            st = os.stat(d)
        except OSError:
            return d
        if not (st.st_mode & stat.S_IXOTH or (st.st_mode & stat.S_IXGRP and st.st_gid == team_gid)):
            return d
    return None


def check_squashing(layout: Layout) -> list[Finding]:
    """NFS exports squash root by default: a root worker then writes the share as nobody, or
    not at all. Only the spool's owner can tell, by creating a file and looking at its owner."""
    if os.geteuid() != 0:
        return []
    probe = layout.state / f".doctor-{os.getpid()}.tmp"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except PermissionError:
        return [
            Finding(
                "fail",
                "squash",
                f"root cannot create files in {layout.state}: the export squashes root",
                "export the spool to the GPU boxes with no_root_squash (docs/security.md, Shared disks)",
            )
        ]
    except OSError:
        return []
    try:
        owner = os.fstat(fd).st_uid
    finally:
        os.close(fd)
        probe.unlink(missing_ok=True)
    if owner != 0:
        return [
            Finding(
                "fail",
                "squash",
                f"a file root creates in {layout.state} is owned by uid {owner}: the export squashes root",
                "export the spool to the GPU boxes with no_root_squash (docs/security.md, Shared disks)",
            )
        ]
    return [Finding("ok", "squash", "root writes the spool as root (no root squashing)")]


def _owner(path: Path) -> int | None:
    try:
        return os.stat(path).st_uid
    except OSError:
        return None


def check_filesystems(layout: Layout, config: Config) -> list[Finding]:
    out = []
    local = layout.local_dir(this_host(), config.local_dir)
    found = mount_of(local if os.path.exists(local) else local.parent)  # a member may not see into it
    if found and found[1] in NETWORK_FILESYSTEMS:
        out.append(
            Finding(
                "fail",
                "local_dir",
                f"local_dir {local} is on {found[1]}: locks there do not work",
                "set `local_dir: /var/tmp/gpuq-{host}` in config.yaml",
            )
        )
    else:
        out.append(
            Finding(
                "ok", "local_dir", f"local_dir {local} is on a local file system ({found[1] if found else 'unknown'})"
            )
        )
    found = mount_of(layout.root)
    if found is None:
        return out
    point, kind, options = found
    if kind.startswith("nfs"):
        opts = dict(o.partition("=")[::2] for o in options.split(","))
        if opts.get("lookupcache", "all") == "all":
            out.append(
                Finding(
                    "warn",
                    "nfs",
                    f"{point} ({kind}) caches lookups: a spec renamed on another "
                    "box can stay invisible for up to acdirmax seconds",
                    f"mount {point} with -o lookupcache=positive (or none)",
                )
            )
        if "noac" not in opts and float(opts.get("acdirmax", opts.get("actimeo", 60))) > 5:
            out.append(
                Finding(
                    "warn",
                    "nfs",
                    f"{point}: directory attributes cached for up to "
                    f"{opts.get('acdirmax', opts.get('actimeo', 60))} s: new specs may wait that long",
                    f"mount {point} with -o acdirmax=1 (or actimeo=1)",
                )
            )
        shared = os.path.isdir(layout.jobs) and writable_by_others(os.stat(layout.jobs).st_mode)
        if shared and not opts.get("sec", "sys").startswith("krb5"):  # a team's root: members are the risk
            out.append(
                Finding(
                    "warn",
                    "nfs",
                    f"{point} ({kind}, sec={opts.get('sec', 'sys')}): identity is a file's owner, and every "
                    "client that mounts the root says which uid it is: a member who is root on any of them "
                    "can act as anyone",
                    "let no member be root on a client that mounts it, or export it with sec=krb5 "
                    "(docs/security.md, Shared disks)",
                )
            )
        out.append(Finding("ok", "filesystem", f"root on {kind} at {point}"))
    else:
        out.append(Finding("ok", "filesystem", f"root on {kind} at {point} (one box, or a local test)"))
    return out


def check_clocks(layout: Layout) -> list[Finding]:
    """Each heartbeat carries its writer's clock; the file's mtime is the file system's (the
    NFS server's) clock: their difference is each host's offset from that common clock."""
    offsets = {}
    for hb in load_heartbeats(layout):
        try:
            offsets[hb["host"]] = hb.get("t", 0) - os.stat(layout.heartbeat(hb["host"])).st_mtime
        except OSError:
            continue
    if len(offsets) < 2:
        return [Finding("ok", "clocks", "one host: nothing to compare")]
    spread = max(offsets.values()) - min(offsets.values())
    text = ", ".join(f"{h} {o:+.2f}s" for h, o in sorted(offsets.items()))
    if spread > CLOCK_WARN_S:
        return [
            Finding(
                "warn",
                "clocks",
                f"host clocks differ by {spread:.1f} s ({text}); gpuq's safety does "
                "not depend on them, but times in status and reports do",
                "install and enable chrony (or systemd-timesyncd) on every box",
            )
        ]
    return [Finding("ok", "clocks", f"host clocks agree within {spread:.2f} s ({text})")]


def check_cron(layout: Layout, config: Config, now: float) -> Finding:
    """The spool's owner (root, or the one user of a private queue) checks the crontabs that
    start a worker for this root; anyone else checks the workers by their heartbeats and is
    never told to start a worker of their own (newcomer review M9)."""
    if not runs_the_workers(layout):
        live = sorted(str(hb.get("host")) for hb in load_heartbeats(layout) if heartbeat_alive(hb, now))
        if live:
            return Finding("ok", "workers", f"workers are up (by their heartbeats): {', '.join(live)}")
        return Finding("fail", "workers", "no worker has renewed its heartbeat lately", ASK_THE_OWNER)
    sources = []
    if shutil.which("crontab"):
        sources.append(subprocess.run(["crontab", "-l"], capture_output=True, text=True).stdout)
    for path in [Path("/etc/crontab"), *sorted(Path("/etc/cron.d").glob("*"))]:
        try:
            sources.append(path.read_text())
        except OSError:
            continue
    lines = [
        line
        for text in sources
        for line in text.splitlines()
        if not line.lstrip().startswith("#")
        and ("worker.py" in line or "gpuq-worker" in line)
        and _for_root(line, layout.root)
    ]
    if not lines:
        return Finding(
            "fail",
            "cron",
            f"no crontab on {this_host()} starts a gpuq worker for {layout.root}",
            f"crontab -e, and add: {cron_line(layout.root)}",
        )
    if not _running("cron") and not _running("crond"):
        return Finding(
            "warn",
            "cron",
            f"a crontab starts the worker, but no cron daemon runs on {this_host()}",
            "start it: systemctl enable --now cron (Debian/Ubuntu; crond on Red Hat)",
        )
    return Finding("ok", "cron", f"cron starts the worker: {lines[0].strip()}")


def _for_root(line: str, root: Path) -> bool:
    """Whether a crontab line starts a worker for `root`: its --root, else its checkout."""
    words = line.split()
    if "--root" in words[:-1]:
        return Path(words[words.index("--root") + 1]).resolve() == root
    given = next((w.split("=", 1)[1] for w in words if w.startswith("--root=")), None)
    if given is not None:
        return Path(given).resolve() == root
    launcher = next((w for w in words if w.endswith("worker.py")), None)
    return launcher is not None and Path(launcher).resolve().parent == root


def _running(name: str) -> bool:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == name:
                return True
        except OSError:
            continue
    return False


def check_extras(layout: Layout, config: Config) -> list[Finding]:
    """The extras (gpuq/extras/, hooks.py): each broken one, a backend no extra gives, a key
    set that only an absent extra reads, and files under state/ that only it reads."""
    extras = hooks.registry()
    out = [
        Finding("warn", "extras", f"{why}: gpuq runs without it", hooks.fix(name))
        for name, why in extras.broken.items()
    ]
    if config.backend != "local" and config.backend not in extras.backends:
        out.append(
            Finding(
                "fail",
                "extras",
                f"config.yaml sets backend: {config.backend}, which the {config.backend} extra gives, and it is not "
                "loaded: every worker refuses to start",
                f"restore gpuq/extras/{config.backend} (reinstall gpuq from its checkout), or set backend: local",
            )
        )
    out += [Finding("warn", "extras", unused, fix) for unused, fix in hooks.unused_keys(config)]
    out += [Finding("warn", "extras", unused, fix) for unused, fix in hooks.unused_state(layout.state)]
    return out or [Finding("ok", "extras", f"extras loaded: {', '.join(extras.loaded) or 'none'}")]


def diagnose(layout: Layout, config: Config, now: float, squash: list[Finding] | None = None) -> list[Finding]:
    """Every check; `squash`: check_squashing's findings, made by root before it became the
    queue's account (only root can tell)."""
    return [
        check_nvml(layout),
        *check_hosts(layout, config, now),
        *check_permissions(layout),
        *check_reachable(layout),
        *(squash if squash is not None else check_squashing(layout)),
        *check_filesystems(layout, config),
        *check_clocks(layout),
        check_cron(layout, config, now),
        *check_extras(layout, config),
    ]


def as_json(findings: list[Finding]) -> list[dict]:
    return [asdict(f) for f in findings]
