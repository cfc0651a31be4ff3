"""benchmarks/gpu_check.py, the one-shot GPU check, runs end to end (--cpu-smoke: tiny sizes on CPU), so that
the one GPU lease it is made for is not spent on a typo."""

import json
import subprocess
import sys

from cli_helpers import ROOT, hpctrain_env


def test_gpu_check_runs_end_to_end_on_cpu(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--cpu-smoke", "--out",
                           str(tmp_path)], cwd=tmp_path, env=hpctrain_env(), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp_path / "gpu_check.json").read_text())
    errors = {name: s["error"] for name, s in results.items() if isinstance(s, dict) and "error" in s}
    assert not errors, errors
    assert results["defects"]["two_ranks_one_gpu_refused"] and results["defects"]["rng_restored_on_device"]
    variants = results["gpt124m"]
    assert len([v for v in variants.values() if isinstance(v, dict)]) == 3
    assert all(v["tokens_per_s"] > 0 for v in variants.values() if isinstance(v, dict))
    assert {v["vocab"] for v in variants.values() if isinstance(v, dict)} == {1000, 1024}  # padded and not
    assert results["precision"]["bf16"]["finite"] and results["precision"]["fp16"]["finite"]
    assert results["precision"]["fp16"]["scaler"] and results["precision"]["fp16"]["scaler_good_steps"] > 0
    assert results["resume"]["ok"] and results["resume"]["previous_kept"]
    assert results["nccl_teardown"]["left_initialized"] is False
    table = (tmp_path / "gpu_check.md").read_text()
    assert table.startswith("| section | item | value |") and "| resume | ok | True |" in table
    assert proc.stdout.rstrip().splitlines()[-1].startswith("MFU, 124M GPT, bf16, compiled, vocab padded:")
