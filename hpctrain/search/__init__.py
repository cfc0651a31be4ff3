"""Adaptive search (``hydra/sweeper=search``): the space, the study in the sweep dir, the workers, the pruner bridge.

Light at import: optuna is imported only by the modules that need it (study, leases, worker), and only for
search sweeps; torch never on the login node.
"""
