"""Facts about this host that are side effects to read: boot id, process start times."""
from __future__ import annotations

import os
from pathlib import Path

BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")


def boot_id() -> str:
    """Changes at every reboot; tells a rebooted host's stale records from live ones."""
    override = os.environ.get("GPUQ_TEST_BOOT_ID")  # tests stand in a reboot
    if override:
        return override
    try:
        return BOOT_ID_FILE.read_text().strip().replace("-", "")
    except OSError:
        return "unknown-boot"


def process_start_ticks(pid: int) -> int | None:
    """Start time of `pid` in clock ticks since boot: with the pid it names one process
    for the life of the boot, so a recycled pid is never mistaken for our supervisor."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def ensure_private_dir(path: Path) -> Path:
    """Create a 0700 directory we own; refuse one that is a link or someone else's."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = os.lstat(path)
    import stat as st_mod

    if not st_mod.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise PermissionError(f"{path} is not a directory owned by uid {os.getuid()}; "
                              f"remove it or set local_dir in config.yaml")
    return path
