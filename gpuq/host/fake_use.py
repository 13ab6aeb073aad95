"""`gpuq fake-use`: what a job on fake GPUs runs to use fake GPU memory (host/fake_nvml.py).

The demo and the tests start one in nearly every job, so `python gpuq.py fake-use` runs this
module without loading the CLI (gpuq.py): the CLI's imports were most of a fifth of a second
of CPU for each. The CLI's `gpuq fake-use` passes its arguments here whole and loads this
module only when the verb runs."""

from __future__ import annotations

import argparse
import os
import sys

from gpuq.host.fake_nvml import NVMLError, use
from gpuq.model.units import parse_size_mib


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="gpuq fake-use",
        description="inside a job on fake GPUs: use fake GPU memory and utilization for this process's lifetime",
    )
    parser.add_argument("--mem", help="per GPU (default: $GPUQ_GPU_MEM_MIB, the job's declared memory)")
    parser.add_argument("--util", type=int, default=50, help="utilization percent (default 50)")
    parser.add_argument("--seconds", type=float, help="hold for this long (or run the command after --)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    try:
        mem = parse_size_mib(args.mem) if args.mem else int(os.environ.get("GPUQ_GPU_MEM_MIB", "0"))
    except ValueError as e:
        print(f"gpuq fake-use: {'--mem' if args.mem else '$GPUQ_GPU_MEM_MIB'}: {e}", file=sys.stderr)
        return 2
    try:
        return use(mem, args.util, args.seconds, command)
    except NVMLError as e:
        print(f"gpuq fake-use: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # its registration under the fake GPUs' use/ directory (as the CLI says one)
        print(f"gpuq fake-use: {e}", file=sys.stderr)
        return 1


def cmd_fake_use(args: argparse.Namespace) -> int:
    """Through the CLI, which passes the arguments on whole."""
    return main(args.arguments)
