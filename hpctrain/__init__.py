"""hpctrain: Hydra sweeps on Slurm with submitit, Apptainer and a DDP trainer."""

__version__ = "0.1.0"
