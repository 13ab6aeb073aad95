"""Debian packages some tests need (Slurm, cron, docker, podman), installed with apt-get where
missing: the one place that knows how (tests marked `installs`; README says which)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

# Another apt-get (a second copy of the suite, or another test of this one) may hold dpkg's
# lock: wait for it rather than fail.
_APT = ["apt-get", "-o", "DPkg::Lock::Timeout=600"]


def found(binaries: tuple[str, ...]) -> bool:
    return all(shutil.which(b) or Path(f"/usr/sbin/{b}").exists() for b in binaries)


def install(packages: tuple[str, ...], binaries: tuple[str, ...]) -> str | None:
    """Install `packages` unless `binaries` are all here already. None when they are (now);
    else why not (not root, no apt-get, no package index reachable), for the caller to skip
    or refuse with."""
    if found(binaries):
        return None
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return f"{' '.join(packages)} not installed, and installing needs root and apt-get"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    command = [*_APT, "install", "-y", "-q", "--no-install-recommends", *packages]
    out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    if out.returncode != 0:  # an index never fetched on this machine: once more after an update
        update = subprocess.run([*_APT, "update", "-q"], capture_output=True, text=True, env=env, timeout=900)
        out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
        if out.returncode != 0:
            return f"apt-get install {' '.join(packages)} failed: {(update.stderr + out.stderr)[-400:]}"
    return None
