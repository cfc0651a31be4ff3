"""A Hydra app of a user's own taking part in a search with a scheduler through ``hpctrain.trial``
(the README's example): gradient descent on (x - 3)^2, its state a JSON file in the trial's directory.

Each start appends ``{"start_step", "x", "end"}`` to ``<run_dir>/starts.jsonl``, so that a test can see a
resumed trial continue at its rung's step with the value it paused with.
"""

import json

import hydra
from hydra.core.config_store import ConfigStore

from hpctrain import trial

ConfigStore.instance().store(name="trial_app", node={"max_steps": 90, "eval_every": 10, "lr": 0.05})


@hydra.main(version_base="1.3", config_path=None, config_name="trial_app")
def main(cfg):
    state = trial.load_state() or {"step": 0, "x": 0.0}  # a paused trial resumes from its state
    end = trial.end_step(cfg.max_steps)  # the unit's end; max_steps outside a search
    with open(trial.run_dir() / "starts.jsonl", "a") as f:
        f.write(json.dumps({"start_step": state["step"], "x": state["x"], "end": end}) + "\n")
    while state["step"] < end:
        state["x"] -= cfg.lr * 2 * (state["x"] - 3)  # one training step
        state["step"] += 1
        if state["step"] % cfg.eval_every == 0:
            trial.report((state["x"] - 3) ** 2, state["step"])
    trial.save_state(state)  # exactly at the end step
    return (state["x"] - 3) ** 2  # the objective at the end step


if __name__ == "__main__":
    main()
