"""`gpuq doctor`: what stands between this queue and a working team, each finding with the
command that fixes it. Checks NVML and the driver here, the GPUs each host offers, the
root's permissions, that the local lock directory is local, the root's file system and NFS
mount options, clock offsets between hosts (from their heartbeats), that cron starts a
worker, and that every host runs this gpuq version."""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from . import __version__
from .config import Config
from .hostinfo import NETWORK_FILESYSTEMS, mount_of
from .initroot import cron_line
from .layout import Layout
from .single_instance import this_host
from .views import heartbeat_alive, load_heartbeats

CLOCK_WARN_S = 1.0   # heartbeat time vs the file's mtime, across hosts


@dataclass
class Finding:
    level: str        # ok, warn, fail
    check: str
    message: str
    fix: str = ""


def check_nvml() -> Finding:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            driver = pynvml.nvmlSystemGetDriverVersion()
            count = pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
    except Exception as e:  # NVMLError, ImportError, a missing libnvidia-ml.so: all the same here
        return Finding("warn", "nvml", f"NVML is not usable on {this_host()}: {e}",
                       "on a GPU box: install the NVIDIA driver until `nvidia-smi` works; without "
                       "GPUs, run workers with --fake-gpus 4x24GiB")
    driver = driver.decode() if isinstance(driver, bytes) else driver
    return Finding("ok", "nvml", f"NVML works on {this_host()}: driver {driver}, {count} GPU(s)")


def check_hosts(layout: Layout, config: Config, now: float) -> list[Finding]:
    beats = load_heartbeats(layout)
    if not beats:
        return [Finding("fail", "hosts", "no worker has ever run for this root",
                        f"add to each box's crontab: {cron_line(layout.root)}")]
    out = []
    for hb in beats:
        host, gpus = hb["host"], hb.get("gpus", [])
        offered = config.offered_gpus(host)
        what = f"{len(gpus)} GPU(s)" + (f" (config gpus: {offered})" if offered is not None else "")
        if not heartbeat_alive(hb, now):
            out.append(Finding("warn", "hosts", f"{host}: worker silent for {now - hb.get('t', 0):.0f} s ({what})",
                               f"on {host}: check its crontab and logs/worker-{host}.log"))
        elif hb.get("probe_error"):
            out.append(Finding("warn", "hosts", f"{host}: {hb['probe_error']}", f"on {host}: run `nvidia-smi`"))
        else:
            out.append(Finding("ok", "hosts", f"{host}: up, offers {what}"))
        for runtime, why in sorted(hb.get("runtime_problems", {}).items()):
            out.append(Finding("warn", "containers", f"{host}: {runtime} is installed but unusable: {why}",
                               f"on {host}: start its daemon (`systemctl start {runtime}`) or check `{runtime} "
                               "version`; jobs needing it are not placed there meanwhile"))
        if hb.get("runtimes"):
            found = ", ".join(f"{n} {v}" for n, v in sorted(hb["runtimes"].items()))
            out.append(Finding("ok", "containers", f"{host}: {found}"))
        if hb.get("version") != __version__:
            out.append(Finding("fail", "version", f"{host} runs gpuq {hb.get('version')}, this is {__version__}",
                               f"on {host}: update its checkout (git pull; pip install -e .) so every box runs "
                               "one version"))
    return out


def check_permissions(layout: Layout) -> list[Finding]:
    out = []
    for d in (layout.jobs, layout.control):
        mode = os.stat(d).st_mode
        shared = mode & (stat.S_IWGRP | stat.S_IWOTH)
        if shared and not mode & stat.S_ISVTX:
            out.append(Finding("fail", "permissions", f"{d} is writable by others but not sticky: anyone "
                               "could rename or delete another user's file", f"chmod +t {d}"))
        elif not os.access(d, os.W_OK):
            out.append(Finding("fail", "permissions", f"{d} is not writable by you", f"ask the root's owner: "
                               f"chmod g+w {d} (and put you in its group)"))
    if os.stat(layout.root).st_mode & stat.S_IWOTH:
        out.append(Finding("warn", "permissions", f"{layout.root} is world-writable",
                           f"chmod o-w {layout.root} (README: Setting up a shared root)"))
    return out or [Finding("ok", "permissions", "jobs/ and state/control/ are yours to write, and sticky where shared")]


def check_filesystems(layout: Layout, config: Config) -> list[Finding]:
    out = []
    local = config.local_dir_for(layout, this_host())
    found = mount_of(local if local.exists() else local.parent)
    if found and found[1] in NETWORK_FILESYSTEMS:
        out.append(Finding("fail", "local_dir", f"local_dir {local} is on {found[1]}: locks there do not work",
                           "set `local_dir: /var/tmp/gpuq-{host}` in config.yaml"))
    else:
        out.append(Finding("ok", "local_dir", f"local_dir {local} is on a local file system "
                           f"({found[1] if found else 'unknown'})"))
    found = mount_of(layout.root)
    if found is None:
        return out
    point, kind, options = found
    if kind.startswith("nfs"):
        opts = dict(o.partition("=")[::2] for o in options.split(","))
        if opts.get("lookupcache", "all") == "all":
            out.append(Finding("warn", "nfs", f"{point} ({kind}) caches lookups: a spec renamed on another "
                               "box can stay invisible for up to acdirmax seconds",
                               f"mount {point} with -o lookupcache=positive (or none)"))
        if "noac" not in opts and float(opts.get("acdirmax", opts.get("actimeo", 60))) > 5:
            out.append(Finding("warn", "nfs", f"{point}: directory attributes cached for up to "
                               f"{opts.get('acdirmax', opts.get('actimeo', 60))} s: new specs may wait that long",
                               f"mount {point} with -o acdirmax=1 (or actimeo=1)"))
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
        return [Finding("warn", "clocks", f"host clocks differ by {spread:.1f} s ({text}); gpuq's safety does "
                        "not depend on them, but times in status and reports do",
                        "install and enable chrony (or systemd-timesyncd) on every box")]
    return [Finding("ok", "clocks", f"host clocks agree within {spread:.2f} s ({text})")]


def check_cron(layout: Layout) -> Finding:
    sources = []
    if shutil.which("crontab"):
        sources.append(subprocess.run(["crontab", "-l"], capture_output=True, text=True).stdout)
    for path in [Path("/etc/crontab"), *sorted(Path("/etc/cron.d").glob("*"))]:
        try:
            sources.append(path.read_text())
        except OSError:
            continue
    lines = [line for text in sources for line in text.splitlines()
             if not line.lstrip().startswith("#") and ("worker.py" in line or "gpuq-worker" in line)]
    if not lines:
        return Finding("fail", "cron", f"no crontab on {this_host()} starts a gpuq worker",
                       f"crontab -e, and add: {cron_line(layout.root)}")
    if not _running("cron") and not _running("crond"):
        return Finding("warn", "cron", f"a crontab starts the worker, but no cron daemon runs on {this_host()}",
                       "start it: systemctl enable --now cron (Debian/Ubuntu; crond on Red Hat)")
    return Finding("ok", "cron", f"cron starts the worker: {lines[0].strip()}")


def _running(name: str) -> bool:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == name:
                return True
        except OSError:
            continue
    return False


def diagnose(layout: Layout, config: Config, now: float) -> list[Finding]:
    return [check_nvml(), *check_hosts(layout, config, now), *check_permissions(layout),
            *check_filesystems(layout, config), *check_clocks(layout), check_cron(layout)]


def as_json(findings: list[Finding]) -> list[dict]:
    return [asdict(f) for f in findings]
