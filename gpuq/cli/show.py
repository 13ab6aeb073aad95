"""`gpuq show ID`: everything known about one job, or a group's members."""

from __future__ import annotations

import argparse
import json

from gpuq.cli.common import open_layout, read_config, refuse_bad_id
from gpuq.cli.workflow import show_group
from gpuq.views.show import find_job, show_text


def cmd_show(args: argparse.Namespace) -> int:
    if refuse_bad_id("show", args.id):
        return 1
    layout = open_layout(args)
    job = find_job(layout, read_config(layout), args.id)
    if job is None:
        return show_group(layout, args)
    if args.json:
        print(json.dumps(job, indent=1))
    else:
        print(show_text(job, whole_env=args.env))
    return 0
