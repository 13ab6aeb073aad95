"""Pure decisions over model values: the plan, placement arithmetic, reasons in users' words.
No files, no processes, no NVML, no clock."""
