"""Runs on the login node: plan, checks, snapshot, submission, the Slurm and local backends. No torch."""
