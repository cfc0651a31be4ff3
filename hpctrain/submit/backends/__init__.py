"""How a submission reaches the machines: Slurm (one job array) or this machine (submitit's local executor)."""
