"""Real container runtimes for the tests: podman, and docker (a private dockerd), each with an
image made here from a static busybox (no registry is reached). Debian's podman, runc,
docker.io and busybox-static are installed with apt-get when missing and the tests run as root
(as CI does). `podman_ready` / `docker_ready` raise RuntimeUnavailable saying exactly what
refused.

The containers.conf written for podman suits small VMs: runc rather than crun (crun refuses
hosts with hybrid cgroups), and explicit ulimits (podman's default raises RLIMIT_NOFILE/NPROC,
which an unprivileged VM's container refuses). The dockerd runs without iptables or a bridge
(containers get no network), its state in a temporary directory."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

import debian

IMAGE = "localhost/gpuq-test:busybox"
PACKAGES = {
    "podman": ("podman", "runc", "conmon", "busybox-static", "catatonit", "uidmap"),
    "docker": ("docker.io", "busybox-static"),
}
CONF = """[containers]
default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]
init_path = "/usr/bin/catatonit"
netns = "none"  # jobs need no network, and slirp4netns needs /dev/net/tun, which a CI box may not give

[engine]
runtime = "runc"
"""


class RuntimeUnavailable(Exception):
    pass


def _install(runtime: str, binaries: tuple[str, ...]) -> None:
    if (why := debian.install(PACKAGES[runtime], binaries)) is not None:
        raise RuntimeUnavailable(why)


def _rootfs(base: Path) -> Path:
    rootfs = base / "rootfs.tar"
    with tarfile.open(rootfs, "w") as tar:
        busybox = shutil.which("busybox") or "/bin/busybox"
        tar.add(busybox, "bin/busybox")
        for applet in ("sh", "echo", "sleep", "id", "pwd", "cat", "true", "false", "env", "ls", "touch"):
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(link)
        for d in ("tmp", "proc", "sys", "dev", "etc"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755
            tar.addfile(info)
    return rootfs


def _prove(runtime: str, env: dict[str, str], rootfs: Path) -> None:
    for step in ([runtime, "import", str(rootfs), IMAGE], [runtime, "run", "--rm", IMAGE, "/bin/sh", "-c", "echo ok"]):
        out = subprocess.run(step, capture_output=True, text=True, env={**os.environ, **env}, timeout=300)
        if out.returncode != 0:
            raise RuntimeUnavailable(f"`{' '.join(step)}` failed: {(out.stderr or out.stdout).strip()[-400:]}")


def podman_ready(base: Path) -> dict[str, str]:
    """Install podman if needed, import the test image, check that a container runs; return
    the environment a worker needs to use it."""
    _install("podman", ("podman", "runc", "busybox"))
    (base / "containers.conf").write_text(CONF)
    env = {"CONTAINERS_CONF": str(base / "containers.conf")}
    _prove("podman", env, _rootfs(base))
    return env


class MemberPodman:
    """Rootless podman as a team's member has it (a root worker runs a job's client as the
    job's owner): a member made here, in `group`, with a home of their own and subordinate ids,
    the test image in their storage. `env` is what every client needs beside that (config
    container_env). stop() ends the member's processes (podman's pause process lingers) and
    removes them."""

    def __init__(self, base: Path, name: str, group: str) -> None:
        _install("podman", ("podman", "runc", "busybox", "newuidmap"))
        base.mkdir(parents=True, exist_ok=True)
        os.chmod(base, 0o755)
        self.base, self.name, self.home = base, name, base / "home"
        subprocess.run(["userdel", "-r", name], capture_output=True)  # an earlier run's, killed
        made = subprocess.run(
            ["useradd", "-m", "-d", str(self.home), "-G", group, "-s", "/bin/sh", name], capture_output=True, text=True
        )
        if made.returncode != 0:
            raise RuntimeUnavailable(f"useradd {name}: {made.stderr.strip()}")
        self.user = pwd.getpwnam(name)
        for kind in ("uid", "gid"):
            if not any(line.split(":")[0] == name for line in Path(f"/etc/sub{kind}").read_text().splitlines()):
                first = 200000 + (self.user.pw_uid % 10000) * 65536
                subprocess.run(["usermod", f"--add-sub{kind}s", f"{first}-{first + 65535}", name], check=True)
        conf = base / "containers.conf"
        conf.write_text(CONF)
        os.chmod(conf, 0o644)
        self.env = {"CONTAINERS_CONF": str(conf)}
        rootfs = _rootfs(base)
        os.chmod(rootfs, 0o644)
        try:
            for step in (
                ["podman", "import", str(rootfs), IMAGE],
                ["podman", "run", "--rm", IMAGE, "/bin/sh", "-c", "echo ok"],
            ):
                out = self.run(step)
                if out.returncode != 0:
                    raise RuntimeUnavailable(
                        f"`{' '.join(step)}` as {name} failed: {(out.stderr or out.stdout).strip()[-400:]}"
                    )
        except BaseException:
            self.stop()
            raise

    def run(self, argv: list[str]) -> subprocess.CompletedProcess:
        """`argv` as the member, from their home, as a login would start it."""
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(self.home), "USER": self.name, **self.env}
        return subprocess.run(
            argv,
            capture_output=True,
            text=True,
            env=env,
            cwd=self.home,
            timeout=300,
            user=self.user.pw_uid,
            group=self.user.pw_gid,
            extra_groups=os.getgrouplist(self.name, self.user.pw_gid),
        )

    def stop(self) -> None:
        # userdel refuses a user whose processes still run, and a SIGKILLed process takes a
        # moment to go: a run whose podman could not start (a skip) left its user behind.
        deadline = time.monotonic() + 30
        while True:
            subprocess.run(["pkill", "-KILL", "-u", self.name], capture_output=True)
            if subprocess.run(["userdel", self.name], capture_output=True).returncode in (0, 6):  # 6: none
                break
            if time.monotonic() > deadline:
                break  # left for the next run's userdel at its start
            time.sleep(0.1)
        uid = self.user.pw_uid  # what rootless podman leaves outside the home, per uid
        leftovers = [f"/dev/shm/libpod_rootless_lock_{uid}", f"/tmp/podman-run-{uid}", f"/tmp/containers-user-{uid}"]
        subprocess.run(["rm", "-rf", str(self.base), *leftovers])  # the storage holds files of subordinate ids


class Dockerd:
    """A private dockerd: started here, stopped by stop(). `group`: whose members may use its
    socket (docker's own `docker` group, as a team's admin would grant it)."""

    def __init__(self, group: str | None = None) -> None:
        _install("docker", ("dockerd", "docker", "busybox"))
        # Short paths: containerd's sockets live under exec-root (a socket path has 108 bytes).
        self.base = Path(tempfile.mkdtemp(prefix="gpuq-dockerd-"))
        os.chmod(self.base, 0o755)  # the socket's group reaches it
        self.env = {"DOCKER_HOST": f"unix://{self.base}/docker.sock"}
        self.proc = subprocess.Popen(
            [
                shutil.which("dockerd") or "/usr/sbin/dockerd",
                "--data-root",
                str(self.base / "data"),
                "--exec-root",
                str(self.base / "x"),
                "--pidfile",
                str(self.base / "pid"),
                "-H",
                self.env["DOCKER_HOST"],
                "--iptables=false",
                "--bridge=none",
                *(["--group", group] if group else []),
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(self.base / "log", "wb"),
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            probe = subprocess.run(
                ["docker", "version", "--format", "{{.Server.Version}}"],
                capture_output=True,
                text=True,
                env={**os.environ, **self.env},
                timeout=30,
            )
            if probe.returncode == 0:
                break
            if self.proc.poll() is not None:
                self.stop()
                raise RuntimeUnavailable(f"dockerd exited: {(self.base / 'log').read_text()[-400:]}")
            time.sleep(0.3)
        else:
            self.stop()
            raise RuntimeUnavailable(f"dockerd did not answer in 60 s: {(self.base / 'log').read_text()[-400:]}")
        try:
            _prove("docker", self.env, _rootfs(self.base))
        except RuntimeUnavailable:
            self.stop()
            raise

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # dockerd stops its containers
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.base, ignore_errors=True)


def containers_named(runtime: str, prefix: str, env: dict[str, str]) -> list[str]:
    out = subprocess.run(
        [runtime, "ps", "--all", "--format", "{{.Names}}"],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=60,
    )
    return [n for n in out.stdout.split() if n.startswith(prefix)]
