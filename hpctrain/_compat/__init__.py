"""Every private name of the libraries hpctrain builds on, a module per library.

These are the names a new release of those libraries may move without notice; the pins in
pyproject.toml are as wide as the versions CI runs the tests against (``.ci/run`` runs the login-node
tests against the oldest and the newest supported hydra-core and omegaconf). When a release breaks
one of these, this module is the one to change. Imports are done where each is used, so that
nothing heavy is loaded on the login node for a name it does not need (no torch here).
"""
