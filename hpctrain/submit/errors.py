"""The login node's one error: bad input, or failed runs."""

from hydra.errors import CompactHydraException


class LaunchError(CompactHydraException):
    """Bad input found on the login node, or failed runs: Hydra prints the message alone, exits 1."""
