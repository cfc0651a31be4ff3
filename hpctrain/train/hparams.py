"""What TensorBoard's HParams tab shows for a run: the swept keys first, the objective as the metric.

TensorBoard sorts the hyperparameter columns by (not ``differs``, name): the keys this run's command
line set (Hydra's ``hydra.overrides.task``) are marked ``differs`` so they come first, the constants
after them. The metrics are the objective, then the other final values, as the scalar tags the run logs.
"""

from typing import Any, Dict, List, Mapping

from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

from hpctrain.core.redact import REDACTED, is_secret_key, redact_config


def swept_keys(task_overrides: List[str]) -> Dict[str, str]:
    """``["lr=0.001", "model=cnn", "+model.width=24"]`` -> ``{"lr": "0.001", "model": "cnn", "model.width": "24"}``."""
    out: Dict[str, str] = {}
    for override in OverridesParser.create().parse_overrides(list(task_overrides)):
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


def run_summaries(cfg: DictConfig, last: Mapping[str, float]) -> List[Summary]:
    """This run's HParams: its command-line keys first; the objective, then the final values, as metrics."""
    swept = swept_keys(HydraConfig.get().overrides.task) if HydraConfig.initialized() else {}
    flat = ordered(flatten(redact_config(cfg)), swept)
    tags = [cfg.objective.metric] + [k for k in last if k != cfg.objective.metric]
    return summaries(flat, [t for t in tags if t in last and not t.startswith("perf/")], swept)


def flatten(node: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    """``{"model": {"hidden": 8}}`` -> ``{"model.hidden": 8}``, leaves as TensorBoard hparam values."""
    out: Dict[str, Any] = {}
    for key, value in node.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value if isinstance(value, (int, float, str, bool)) else str(value)
    return out
