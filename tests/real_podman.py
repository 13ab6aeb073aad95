"""A real container runtime for the tests: podman, with an image made here from a static
busybox (no registry is reached). Debian's podman, runc and busybox-static are installed with
apt-get when missing and the tests run as root (as CI does). `ready` raises PodmanUnavailable
saying exactly what refused.

The containers.conf written here suits small VMs: runc rather than crun (crun refuses hosts
with hybrid cgroups), and explicit ulimits (podman's default raises RLIMIT_NOFILE/NPROC, which
an unprivileged VM's container refuses)."""
from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from pathlib import Path

IMAGE = "localhost/gpuq-test:busybox"
PACKAGES = ("podman", "runc", "conmon", "busybox-static", "catatonit")
CONF = """[containers]
default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]
init_path = "/usr/bin/catatonit"

[engine]
runtime = "runc"
"""


class PodmanUnavailable(Exception):
    pass


def _install() -> None:
    if shutil.which("podman") and shutil.which("runc") and shutil.which("busybox"):
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise PodmanUnavailable("podman is not installed, and installing it needs root and apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    command = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES]
    out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    if out.returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], capture_output=True, text=True, env=env, timeout=900)
        out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
        if out.returncode != 0:
            raise PodmanUnavailable(f"apt-get install {' '.join(PACKAGES)} failed: {out.stderr[-400:]}")


def ready(base: Path) -> dict[str, str]:
    """Install podman if needed, import the test image, check that a container runs; return
    the environment a worker needs to use it."""
    _install()
    conf = base / "containers.conf"
    conf.write_text(CONF)
    env = {**os.environ, "CONTAINERS_CONF": str(conf)}
    rootfs = base / "rootfs.tar"
    with tarfile.open(rootfs, "w") as tar:
        busybox = shutil.which("busybox") or "/bin/busybox"
        tar.add(busybox, "bin/busybox")
        for applet in ("sh", "echo", "sleep", "id", "pwd", "cat", "true", "false", "env", "ls"):
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(link)
        for d in ("tmp", "proc", "sys", "dev", "etc"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755
            tar.addfile(info)
    steps = [["podman", "import", str(rootfs), IMAGE],
             ["podman", "run", "--rm", IMAGE, "/bin/sh", "-c", "echo ok"]]
    for step in steps:
        out = subprocess.run(step, capture_output=True, text=True, env=env, timeout=300)
        if out.returncode != 0:
            raise PodmanUnavailable(f"`{' '.join(step)}` failed: {(out.stderr or out.stdout).strip()[-400:]}")
    return {"CONTAINERS_CONF": str(conf)}


def containers_named(prefix: str, env: dict[str, str]) -> list[str]:
    out = subprocess.run(["podman", "ps", "--all", "--format", "{{.Names}}"], capture_output=True, text=True,
                         env={**os.environ, **env}, timeout=60)
    return [n for n in out.stdout.split() if n.startswith(prefix)]
