"""`gpuq export slurm SPEC...`: each spec (a file, or the id of a pending job) as an sbatch
script on stdout, separated by a blank line (slurm/export.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpuq.cli.common import open_layout, read_config
from gpuq.extras.slurm.export import ExportError, handed_over, sbatch_script
from gpuq.model.errors import SpecError
from gpuq.model.spec import parse_spec_text
from gpuq.spool.intake import read_spec_file
from gpuq.spool.store import pending_spec_path


def cmd_export(args: argparse.Namespace) -> int:
    layout = open_layout(args)
    config = read_config(layout)
    ids = handed_over(layout.state / "slurm")
    scripts, bad, missing = [], False, False
    for item in args.specs:
        path = Path(item) if Path(item).is_file() else pending_spec_path(layout, item)
        if path is None:
            print(f"gpuq export: {item}: neither a spec file nor a pending job", file=sys.stderr)
            missing = True
            continue
        job_id = path.name.rsplit(".", 1)[0]
        try:
            raw, _ = read_spec_file(path, str(path))
            spec = parse_spec_text(raw, str(path))
            scripts.append(sbatch_script(job_id, spec, config, str(layout.job_log(job_id)), str(layout.root), ids))
        except (SpecError, ExportError, OSError) as e:
            print(f"gpuq export: {item}: {e}", file=sys.stderr)
            bad = True
    print("\n".join(scripts), end="")
    return 2 if bad else 1 if missing else 0  # docs/reference.md: 2 bad input, 1 not found
