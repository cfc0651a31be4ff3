"""TensorBoard's private names (torch.utils.tensorboard's FileWriter).

When a release moves one of these, this module is the one to change (canaries: tests/test_compat_heavy.py).
"""

from typing import Any


# TensorBoard (torch.utils.tensorboard)
def file_writer(summary_writer: Any) -> Any:
    """The SummaryWriter's underlying FileWriter, to add the HParams summaries it has no public call for."""
    return summary_writer._get_file_writer()


# TensorBoard (the server): what `tensorboard.main.run_main` does before it builds the program
def global_init() -> None:
    """TensorBoard's process set-up (logging, TF stub checks) that ``tensorboard.main`` runs first."""
    from tensorboard import main_lib

    main_lib.global_init()
