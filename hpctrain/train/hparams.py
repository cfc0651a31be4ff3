"""What TensorBoard's HParams tab shows for a run: the swept keys, the objective as the metric.

The hyperparameters are the keys whose values differ between the runs of this run's sweep (read from
sweep.json beside the run dir; a run outside a sweep: the keys its command line set), each marked
``differs`` so TensorBoard shows them first; a config group by its chosen option (``model=cnn``). The
constants go into the run's config text (TensorBoard's Text tab), not into the table. The metrics are the
objective, then the losses, then the other final values, as the scalar tags the run logs (:func:`first_things_first`).

TensorBoard's Time Series tab sorts cards by tag name; its Custom Scalars tab keeps the order a run's layout
gives: :func:`layout` puts the objective first, then the losses (train and val on one chart), then the rest.
"""

from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

from hpctrain.core import manifest
from hpctrain.core.redact import REDACTED, is_secret_key, redact_config
from hpctrain.core.run import RunSpec


def swept_keys(task_overrides: List[str]) -> Dict[str, str]:
    """``["lr=0.001", "model=cnn", "+model.width=24"]`` -> ``{"lr": "0.001", "model": "cnn", "model.width": "24"}``.
    ``task_overrides``: this run's own, as Hydra gave them to it (never sweep.json's redacted copies)."""
    out: Dict[str, str] = {}
    try:
        parsed = OverridesParser.create().parse_overrides(list(task_overrides))
    except Exception:  # noqa: BLE001 - the table is for reading: a line the grammar refuses is read as text
        as_text = RunSpec(0, tuple(task_overrides), Path()).values()
        return {k: REDACTED if is_secret_key(k) else v for k, v in as_text.items()}
    for override in parsed:
        if not override.is_delete():
            key = override.key_or_group
            out[key] = REDACTED if is_secret_key(key) else override.get_value_element_as_str()
    return out


def ordered(flat: Dict[str, Any], swept: Dict[str, str]) -> Dict[str, Any]:
    """The swept keys first (a config group by its chosen option), then the constants."""
    first = {key: flat.get(key, value) for key, value in swept.items()}
    return {**first, **{k: v for k, v in flat.items() if k not in first}}


def summaries(hparams: Dict[str, Any], metric_tags: List[str], swept: Dict[str, str]) -> List[Summary]:
    """torch's HParams summaries (experiment, session start, session end), swept keys marked ``differs``."""
    from torch.utils.tensorboard.summary import hparams as hparams_summary

    exp, ssi, sei = hparams_summary(hparams, {tag: 0.0 for tag in metric_tags})
    value = exp.value[0]
    data = HParamsPluginData.FromString(value.metadata.plugin_data.content)
    for info in data.experiment.hparam_infos:
        info.differs = info.name in swept
    value.metadata.plugin_data.content = data.SerializeToString()
    return [exp, ssi, sei]


def sweep_swept(run_dir: Optional[Path], own: Dict[str, str]) -> Dict[str, str]:
    """Of this run's command-line keys ``own``, those whose values differ between the runs of its sweep."""
    found = manifest.read(run_dir.parent) if run_dir is not None else None
    if found is None or len(found.runs) < 2 or not any(e.spec.run_dir == run_dir for e in found.runs.values()):
        return own
    values = [e.spec.values() for e in found.runs.values()]  # as text: a secret's value there is <redacted>
    varying = {k for k in {k for v in values for k in v} if len({v.get(k) for v in values}) > 1}
    return {k: v for k, v in own.items() if k in varying}


def _table(cfg: DictConfig, run_dir: Optional[Path]) -> "tuple[Dict[str, Any], Dict[str, str], Any]":
    """The HParams table (swept key: value), the swept keys, and the redacted config."""
    own = swept_keys(HydraConfig.get().overrides.task) if HydraConfig.initialized() else {}
    swept = sweep_swept(Path(run_dir).absolute() if run_dir is not None else None, own)
    plain = redact_config(cfg)
    flat = flatten(plain)
    return {key: flat.get(key, value) for key, value in swept.items()}, swept, plain


def start_summaries(cfg: DictConfig, run_dir: Optional[Path] = None) -> List[Summary]:
    """The session-start record alone, written at step 0: the HParams tab lists a run from its start (the
    experiment, with the metrics, comes at the end; until one exists TensorBoard derives it from the runs)."""
    table, swept, _ = _table(cfg, run_dir)
    return [summaries(table, [], swept)[1]]


def run_summaries(cfg: DictConfig, last: Mapping[str, float], run_dir: Optional[Path] = None) -> List[Summary]:
    """This run's HParams (the swept keys; the objective, then the final values, as metrics) and its config."""
    from torch.utils.tensorboard.summary import text

    table, swept, plain = _table(cfg, run_dir)
    tags = first_things_first(cfg.objective.metric, list(last))
    config = text("config", "```yaml\n" + OmegaConf.to_yaml(OmegaConf.create(plain)) + "```")
    return summaries(table, [t for t in tags if t in last and not t.startswith("perf/")], swept) + [config]


def flatten(node: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    """``{"model": {"hidden": 8}}`` -> ``{"model.hidden": 8}``, leaves as TensorBoard hparam values."""
    out: Dict[str, Any] = {}
    for key, value in node.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value if isinstance(value, (int, float, str, bool)) else str(value)
    return out


def first_things_first(objective: str, tags: List[str]) -> List[str]:
    """The objective, then the losses (``train/loss``, ``val/loss``, ...), then ``val/*``, then the rest, each in
    the order given: what a reader looks at first."""
    def rank(tag: str) -> int:
        if tag == objective:
            return 0
        if tag.rsplit("/", 1)[-1] == "loss":
            return 1
        return 2 if tag.startswith("val/") else 3
    return sorted(dict.fromkeys(tags), key=rank)  # stable: ties keep their order


def layout(objective: str, metric_names: List[str]) -> Dict[str, Dict[str, List[Any]]]:
    """The Custom Scalars tab's layout for a run (``SummaryWriter.add_custom_scalars``): categories in order,
    the objective first, then the losses, the other metrics, training and throughput."""
    losses = first_things_first(objective, ["train/loss", "val/loss"])
    metrics = [f"val/{name}" for name in metric_names if f"val/{name}" != objective]
    categories: Dict[str, Dict[str, List[Any]]] = {
        "objective": {f"{objective} (objective)": ["Multiline", [objective]]},
        "losses": {"train/loss and val/loss": ["Multiline", losses]},
    }
    if metrics:
        categories["metrics"] = {tag: ["Multiline", [tag]] for tag in metrics}
    categories["training"] = {"train/lr": ["Multiline", ["train/lr"]], "train/grad_norm": ["Multiline", ["train/grad_norm"]]}
    categories["throughput"] = {"perf": ["Multiline", [r"perf/.*"]]}
    return categories
