"""hpctrain's Hydra configs, shipped as package data (``pkg://hpctrain.conf``)."""
