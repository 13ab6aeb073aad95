"""This machine: NVML, /proc, process trees, users and groups, file writes, fault hooks."""
