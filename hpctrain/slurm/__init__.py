"""Slurm's commands (query.py: subprocess, unknown-not-gone) and their output (parse.py: pure)."""
