"""The ``hpctrain`` tab inside TensorBoard (a plugin loaded by entry point and by hpctrain's own server)."""

from hpctrain.review.tensorboard_plugin.plugin import PLUGIN_NAME, HpctrainLoader, HpctrainPlugin

__all__ = ["PLUGIN_NAME", "HpctrainLoader", "HpctrainPlugin"]
