"""``from hpctrain import trial``: a Hydra app's side of a search (see :mod:`hpctrain.search.api`)."""

from hpctrain.search.api import current, end_step, load_state, report, run_dir, save_state, state_dir

__all__ = ["current", "end_step", "report", "run_dir", "state_dir", "save_state", "load_state"]
