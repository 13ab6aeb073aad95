"""Options that more than one verb declares (submit, and the spec a held job is edited into):
argparse declarations only, so that building the parser loads no verb's code."""

from __future__ import annotations

import argparse

from gpuq import hooks


def gpu_count(text: str) -> int:
    """--gpus N, or sbatch's -G gpu:N; a GPU type (a100:2) is not one gpuq chooses by."""
    kind, _, count = text.rpartition(":")
    if not count.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of GPUs; give one like 2")
    if kind not in ("", "gpu"):
        raise argparse.ArgumentTypeError(
            f"gpuq does not choose GPUs by type ({kind}); give the count, and --hosts for the boxes that have them"
        )
    return int(count)


def gres_count(text: str) -> int:
    """sbatch's --gres=gpu[:N] as a number of GPUs (other generic resources gpuq has none of)."""
    if text == "gpu":
        return 1
    if not text.startswith("gpu:") or "," in text:
        raise argparse.ArgumentTypeError(f"{text!r}: gpuq knows only --gres=gpu:N (the GPUs on one box)")
    return gpu_count(text)


def add_limit_options(sp: argparse.ArgumentParser) -> None:
    """Slurm's spellings where it has them (sbatch --time, --cpus-per-task, --mem)."""
    sp.add_argument(
        "-t",
        "--time-limit",
        "--time",
        dest="time_limit",
        metavar="DURATION",
        help="stop it after this long and record it as timeout; read as sbatch's --time: 90 is 90 "
        "minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS (seconds rounded up to a minute); or 90m, 2h, 1d",
    )
    sp.add_argument(
        "--gpu-compute",
        dest="gpu_compute",
        metavar="PCT",
        help="its share of the GPU's compute (50%%): jobs whose shares fit share a GPU; under MPS, its limit",
    )
    sp.add_argument(
        "-c",
        "--cpus",
        "--cpus-per-task",
        dest="cpus",
        metavar="N",
        help="CPU cores it is pinned to (sbatch's -c), held for it: it starts where a box has that many not held",
    )
    sp.add_argument(
        "--mem",
        metavar="SIZE",
        help="host memory it may use (8GiB; a bare number is MiB, as sbatch's), held for it as sbatch holds it; "
        "stopped above it",
    )
    sp.add_argument("--grace", metavar="DURATION", help="time between SIGTERM and SIGKILL when it is stopped")
    sp.add_argument("--retries", metavar="N", help="re-runs after its box is lost (0: never run it twice)")
    sp.add_argument(
        "--restart", metavar="POLICY", help="never (default), on-failure or always: a service restarted in place"
    )
    sp.add_argument(
        "--preemptible",
        action="store_true",
        help="opportunistic: runs on idle GPUs and yields to ordinary jobs and to people",
    )
    sp.add_argument(
        "--hold",
        action="store_true",
        help="submit it held (sbatch --hold): it waits, keeping its place, until `gpuq release ID`",
    )


def add_environment_options(sp: argparse.ArgumentParser) -> None:
    for extra_field in hooks.registry().spec_fields.values():  # --container, from its extra
        if extra_field.options is not None:
            extra_field.options(sp)
    sp.add_argument("--venv", metavar="DIR", help="activate this virtualenv first")
    sp.add_argument("--conda", metavar="ENV", help="activate this conda environment first")
    sp.add_argument("--setup", action="append", metavar="LINE", help="shell line run before the command (repeatable)")
    sp.add_argument(
        "--export",
        metavar="ALL|NONE|NAME,..[,NAME=VALUE]",
        help="your variables the job records, as sbatch's --export (default: ALL but what looks "
        "like a secret, which is stored only when named: ALL,HF_TOKEN; NONE for a job in a container)",
    )


def add_filter_options(sp: argparse.ArgumentParser) -> None:
    """scancel's filters, for the verbs that act on many jobs: ids, or all of one's jobs that
    match, or both (then the ids that match)."""
    sp.add_argument("ids", nargs="*", metavar="ID", help="job ids (a sweep's or array's id: its members)")
    who = sp.add_mutually_exclusive_group()
    who.add_argument("--me", action="store_true", help="my jobs (what a filter alone takes)")
    who.add_argument("-u", "--user", help="this user's jobs (comma-separated users; acting on others' needs the right)")
    sp.add_argument(
        "-t",
        "--state",
        help="only jobs in these states (comma-separated; scancel's PD, R, CD, F, CA, TO too)",
    )
    sp.add_argument("-n", "--name", help="only jobs of these names (comma-separated; shell patterns: 'sweep-*')")


# sbatch options a Slurm user types that gpuq has no such option for: what to do instead.
SBATCH_ONLY = {
    "--partition": "gpuq has one queue for the team; --hosts a,b picks the boxes a job may run on",
    "-p": "gpuq has one queue for the team; --hosts a,b picks the boxes a job may run on",
    "--output": "a job's output (stdout and stderr) is logs/ID.log: gpuq logs ID [-f]",
    "-o": "a job's output (stdout and stderr) is logs/ID.log: gpuq logs ID [-f]",
    "--error": "a job's output (stdout and stderr) is logs/ID.log: gpuq logs ID [-f]",
    "-e": "a job's output (stdout and stderr) is logs/ID.log: gpuq logs ID [-f]",
    "--mail-type": "gpuq sends no mail yet; `gpuq wait ID; mail ...` does it",
    "--mail-user": "gpuq sends no mail yet; `gpuq wait ID; mail ...` does it",
    "--nodes": "a job runs on one box: --gpus N there",
    "-N": "a job runs on one box: --gpus N there",
    "--ntasks": "a job is one command; start its processes from it (torchrun --nproc-per-node N)",
    "-n": "a job is one command; start its processes from it (torchrun --nproc-per-node N)",
    "--account": "gpuq has no accounts: fair share is by user",
    "-A": "gpuq has no accounts: fair share is by user",
    "--qos": "--priority high|normal|low (or a number)",
    "--exclusive": "a job without --gpu-mem has its GPUs to itself already",
    "--wrap": "give the command after --: gpuq submit -- python train.py",
    "--constraint": "--hosts a,b: the boxes with what the job needs",
    "-C": "--hosts a,b: the boxes with what the job needs",
    "--mem-per-gpu": "--mem SIZE is the job's host memory; --gpu-mem SIZE its memory on each GPU",
    "--cpus-per-gpu": "-c/--cpus N: the cores the whole job gets",
    "--nodelist": "--hosts a,b: the boxes it may run on",
    "-w": "--hosts a,b: the boxes it may run on",
    "--exclude": "--hosts a,b: name the boxes it may run on",
    "-x": "--hosts a,b: name the boxes it may run on",
    "--wait": "gpuq submit ... && gpuq wait ID (its exit status is the job's)",
    "-W": "gpuq submit ... && gpuq wait ID (its exit status is the job's)",
    "--nice": "--priority high|normal|low (or a number)",
    "--requeue": "--retries N: re-runs after its box is lost",
    "--signal": "--grace DURATION: the time between SIGTERM and SIGKILL when it is stopped",
}


def sbatch_only(unknown: list[str]) -> list[str]:
    """For each sbatch option among `unknown` that gpuq does not have, one line: what instead."""
    lines = []
    for word in unknown:
        option = word.split("=", 1)[0]
        if option in SBATCH_ONLY:
            lines.append(f"sbatch's {option} is not one gpuq has: {SBATCH_ONLY[option]}")
    return lines
