"""A real one-node Slurm for the tests: munged, slurmctld and slurmd on localhost, in a
private directory, with two generic GPUs (character devices made like /dev/null: gres.conf
needs files). Debian's slurm-wlm and munge are installed with apt-get when missing and the
tests run as root (as CI does). `SlurmCluster.start` raises SlurmUnavailable saying exactly
what refused."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import debian

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel")


class SlurmUnavailable(Exception):
    pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_installed() -> None:
    if (why := debian.install(("slurm-wlm", "munge"), BINARIES)) is not None:
        raise SlurmUnavailable(why)


class SlurmCluster:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.env = {**os.environ, "SLURM_CONF": str(base / "slurm.conf")}

    def start(self) -> "SlurmCluster":
        ensure_installed()
        if os.geteuid() != 0:
            raise SlurmUnavailable("slurmd runs jobs as their users: the Slurm tests need root")
        b = self.base
        # Job scripts are run from the spool as their users: it must be reachable by them
        # (pytest's own temp dir is root's, 0700).
        self.spool = Path(tempfile.mkdtemp(prefix="gpuq-slurmd-"))
        os.chmod(self.spool, 0o755)
        for d in ("munge", "state", "log", "dev"):
            (b / d).mkdir(parents=True, exist_ok=True)
        os.chmod(b / "munge", 0o755)  # munged refuses a socket directory others could write
        (b / "munge" / "munge.key").write_bytes(os.urandom(1024))
        os.chmod(b / "munge" / "munge.key", 0o400)
        for i in range(2):
            dev = b / "dev" / f"gpu{i}"
            if not dev.exists():
                os.mknod(dev, 0o644 | 0o020000, os.makedev(1, 3))
        socket_path = b / "munge" / "munge.socket"
        (b / "slurm.conf").write_text(f"""ClusterName=gpuqtest
SlurmctldHost=localhost
AuthType=auth/munge
AuthInfo=socket={socket_path}
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
StateSaveLocation={b}/state
SlurmdSpoolDir={self.spool}
SlurmctldPidFile={b}/slurmctld.pid
SlurmdPidFile={b}/slurmd.pid
SlurmctldLogFile={b}/log/slurmctld.log
SlurmdLogFile={b}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=100
SchedulerType=sched/backfill
GresTypes=gpu
DependencyParameters=kill_invalid_depend
JobCompType=jobcomp/filetxt
JobCompLoc={b}/log/jobcomp.txt
ReturnToService=2
MinJobAge=600
MpiDefault=none
NodeName=localhost CPUs={os.cpu_count() or 2} RealMemory=1000 Gres=gpu:2 State=UNKNOWN
PartitionName=main Nodes=localhost Default=YES MaxTime=INFINITE State=UP
""")
        (b / "gres.conf").write_text(f"NodeName=localhost Name=gpu File={b}/dev/gpu[0-1]\n")
        self._run(
            [
                "munged",
                f"--key-file={b}/munge/munge.key",
                f"--socket={socket_path}",
                f"--pid-file={b}/munge/munged.pid",
                f"--log-file={b}/log/munged.log",
                f"--seed-file={b}/munge/seed",
                "--force",
            ],
            "munged",
        )
        self._run(["slurmctld", "-i"], "slurmctld")
        self._run(["slurmd"], "slurmd")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            out = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, env=self.env)
            if out.stdout.strip() == "idle":
                return self
            time.sleep(0.2)
        self.stop()
        raise SlurmUnavailable(f"the node never became idle; slurmd log: {self._tail('slurmd.log')}")

    def _run(self, cmd: list[str], name: str) -> None:
        out = subprocess.run(cmd, capture_output=True, text=True, env=self.env, timeout=60)
        if out.returncode != 0:
            self.stop()
            raise SlurmUnavailable(
                f"{name} refused to start (exit {out.returncode}): "
                f"{(out.stderr or out.stdout).strip()[-300:]} {self._tail(name + '.log')}"
            )

    def _tail(self, log: str) -> str:
        try:
            return (self.base / "log" / log).read_text()[-300:]
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGKILL: a slurmd that has lost its controller ignores SIGTERM. Only the daemon its pid
        file names: one that died earlier left a number another process may have by now. Then
        the jobs still running: each job's slurmstepd is a daemon of its own that outlives
        slurmd, and one that lost its slurmd spun a core for good (a failed test left two)."""
        for pid_file, name in (
            ("slurmd.pid", "slurmd"),
            ("slurmctld.pid", "slurmctld"),
            ("munge/munged.pid", "munged"),
        ):
            try:
                pid = int((self.base / pid_file).read_text())
                if Path(f"/proc/{pid}/comm").read_text().strip() == name:
                    os.kill(pid, signal.SIGKILL)
            except (OSError, ValueError):
                pass
        self._kill_job_steps()  # after slurmd: it could start another meanwhile
        shutil.rmtree(self.spool, ignore_errors=True)

    def _kill_job_steps(self) -> None:
        """This cluster's slurmstepds and the jobs under them. Each carries the cluster's
        SLURM_CONF (slurmd passes its environment on), read from /proc as bytes: slurmstepd
        writes its title over the start of its environment, where psutil stops reading."""
        import psutil

        mine = f"SLURM_CONF={self.env['SLURM_CONF']}".encode()
        for proc in psutil.process_iter(["name"]):
            try:
                environ = Path(f"/proc/{proc.pid}/environ").read_bytes() if proc.info["name"] == "slurmstepd" else b""
                steps = [proc, *proc.children(recursive=True)] if mine in environ.split(b"\0") else []
            except (psutil.Error, OSError):
                continue
            for each in steps:
                try:
                    each.kill()
                except psutil.Error:
                    pass  # gone meanwhile

    def sbatch(self, script: str, *extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["sbatch", *extra], input=script, capture_output=True, text=True, env=self.env, timeout=60, cwd=self.base
        )  # in its directory: a job without --output writes slurm-ID.out where it was submitted

    def job_state(self, slurm_id: str) -> tuple[str, str]:
        """(JobState, ExitCode) from scontrol while Slurm remembers the job."""
        out = subprocess.run(["scontrol", "show", "job", slurm_id], capture_output=True, text=True, env=self.env).stdout
        fields = dict(f.split("=", 1) for f in out.split() if "=" in f)
        return fields.get("JobState", ""), fields.get("ExitCode", "")

    def wait_done(self, slurm_id: str, timeout: float = 60) -> tuple[str, str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state, code = self.job_state(slurm_id)
            if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
                return state, code
            time.sleep(0.2)
        raise AssertionError(f"Slurm job {slurm_id} did not end in {timeout}s: {self.job_state(slurm_id)}")
