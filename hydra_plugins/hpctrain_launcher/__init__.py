"""hpctrain's Hydra launcher plugin: ``hydra/launcher=local`` and ``hydra/launcher=slurm`` on submitit."""
