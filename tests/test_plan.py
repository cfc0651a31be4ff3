"""The launcher's plan (hydra_plugins/hpctrain_launcher/plan.py): its shortcuts give what Hydra and OmegaConf give.

The plan shares one resolved plain copy between a sweep's points and names run dirs without OmegaConf's
resolver; each point's shortcut result is compared here with a full resolve of that point's own config, and
each run dir (the dry run lists them) with OmegaConf's resolve of the config's ``hydra.sweep.subdir``.
"""

from typing import Any, Dict, List, Optional

import pytest
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf

from hpctrain.config import DIRNAME_TEMPLATE

pytestmark = pytest.mark.login  # login-node code: also run against the oldest and newest pinned Hydra


def _dry_run(monkeypatch, tmp_path, *args: str) -> "tuple[List[tuple], str]":
    """Run ``python -m hpctrain -m ARGS`` dry, in this process; every point's (config, plain copy) seen."""
    from hpctrain.__main__ import main
    from hpctrain.app import train

    seen: List[tuple] = []
    real = getattr(train.validate_job, "real", train.validate_job)  # not a spy of an earlier call

    def spy(cfg: DictConfig, world_size: int = 1, plain: Optional[Dict[str, Any]] = None) -> List[str]:
        seen.append((OmegaConf.to_container(cfg, resolve=True), plain))
        return real(cfg, world_size=world_size, plain=plain)

    spy.real = real  # type: ignore[attr-defined]
    monkeypatch.setattr(train, "validate_job", spy)
    monkeypatch.chdir(tmp_path)
    GlobalHydra.instance().clear()
    main(["-m", *args, "hydra/launcher=local", "hydra.launcher.dry_run=true", f"hydra.sweep.dir={tmp_path / 's'}"])
    return seen


def test_shared_plain_copy_equals_a_full_resolve_of_each_point(monkeypatch, tmp_path, capsys):
    # data.num_features feeds model.in_features by interpolation; model=cnn is a second composed base
    seen = _dry_run(monkeypatch, tmp_path, "lr=1e-3,2e-2", "data.num_features=8,12", "max_steps=7")
    seen += _dry_run(monkeypatch, tmp_path, "model=cnn", "data=images", "lr=1e-3,3e-3", "+model.dropout=0.1,0.2")
    assert len(seen) == 8
    shared = [plain for _, plain in seen if plain is not None]
    assert len(shared) == 4  # the first sweep's points; `+key=` points are resolved whole
    for full, plain in seen:
        if plain is not None:
            assert plain == full
    features = [(full["data"]["num_features"], full["model"]["in_features"]) for full, _ in seen[:4]]
    assert features == [(8, 8), (12, 12), (8, 8), (12, 12)]
    assert [full["lr"] for full, _ in seen[:4]] == [1e-3, 1e-3, 2e-2, 2e-2]


def test_run_dir_names_are_hydras(monkeypatch, tmp_path, capsys):
    long = "x" * 150
    _dry_run(monkeypatch, tmp_path, "lr=1e-3,2e-3", f"+tag={long},a/b")
    out = capsys.readouterr().out
    listed = [line.split()[-1].rsplit("/", 1)[-1] for line in out.splitlines() if line.startswith("  ") and "/s/" in line]
    # what OmegaConf makes of conf/config.yaml's hydra.sweep.subdir in the job, for each point
    expected = [str(OmegaConf.create({"hydra": {"job": {"num": i, "override_dirname": d}}, "name": DIRNAME_TEMPLATE}).name)
                for i, d in enumerate([f"+tag={long},lr=0.001", "+tag=a/b,lr=0.001",
                                       f"+tag={long},lr=0.002", "+tag=a/b,lr=0.002"])]
    assert listed == expected
    assert len(listed[0]) == 120 and listed[1] == "1_+tag=a%2Fb,lr=0.001"
