"""The Slurm bridge: a worker that hands jobs to Slurm instead of running them."""
