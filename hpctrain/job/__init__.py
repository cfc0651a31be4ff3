"""Runs inside the allocation, for any Hydra app: the job wrapper, packed runs, the end of an attempt."""
