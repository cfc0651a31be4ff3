"""Every private name of the libraries hpctrain builds on, a module per library.

- ``hydra``: the basic sweeper, the config loader's internals (override application, override
  dirnames, config repository, search path), JobReturn's stored value.
- ``omegaconf``: the interpolation parser, memoized while a sweep is planned.
- ``submitit``: the sbatch writer, memory format, preemption signal, a local job's process, the module
  its jobs run, its folder's file names and the result pickle's outcome.
- ``tensorboard``: a SummaryWriter's FileWriter.
- ``torch``: torch.distributed's abort of the process groups. Imported only from ``hpctrain.train``.
- ``optuna``: a trial's storage id, a live trial over it, the study's storage.

The rule: a private name (``_name``, ``_internal``, a file layout or byte format a library does not
document) is used only here; callers import the public wrapper from here. Each has a canary test
(tests/test_compat.py, login-node; tests/test_compat_heavy.py for torch, Optuna and TensorBoard) that
fails when the library renames or changes it. The pins in pyproject.toml are as wide as the versions
CI runs the tests against (``.ci/pins`` runs the login-node tests against the oldest and the newest
supported hydra-core and omegaconf). A heavy library (torch, Optuna, TensorBoard) is imported inside
the function that needs it, so the login node loads nothing for a name it does not use.
"""
