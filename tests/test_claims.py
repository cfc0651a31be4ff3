"""The claim files' on-disk format: a typed Lease reads what the claims of today's format hold, and writes
the same keys (``<n>.json``, the readable copy, too)."""

import json
from pathlib import Path

from hpctrain.search import claims
from hpctrain.search.claims import Lease, Mark
from hpctrain.search.units import Unit, UnitKind


def test_a_claim_of_the_existing_format_reads_as_a_typed_lease(tmp_path):
    Path(claims.leases_dir(tmp_path)).mkdir(parents=True)
    unit = Unit(3, UnitKind.PROMOTE, 10, 30, {"lr": 0.1}, None, 1, 0)
    written = {"owner": "7_1", "host": "n1", "pid": 4242, "since": 1700000000.5, "gen": 4, "number": 3,
               "adoptions": 1, "slurm_job_id": "7_1", "worker": 1, "unit": unit.fields(), "paused": True, "step": 30}
    Path(claims.claim_path(tmp_path, 3, 4)).write_text(json.dumps(written))
    lease = claims.read_lease(tmp_path, 3)
    assert lease == Lease(3, 4, "7_1", "n1", 4242, 1700000000.5, 1, "7_1", 1, unit, 30, Mark.PAUSED)
    assert lease.mark.resting and not lease.local
    assert lease.to_json() == written


def test_a_claim_writes_the_keys_the_readable_copy_shows(tmp_path):
    got = claims.claim(tmp_path, 0, 1, "8_0", 1000.0, adoptions=0, slurm_job_id="8_0", worker=0)
    assert got is not None and got.mark is Mark.HELD
    copy = json.loads(Path(claims.lease_path(tmp_path, 0)).read_text())
    assert {k: copy[k] for k in ("owner", "gen", "number", "adoptions", "slurm_job_id", "worker", "since")} == \
        {"owner": "8_0", "gen": 1, "number": 0, "adoptions": 0, "slurm_job_id": "8_0", "worker": 0, "since": 1000.0}
    released = claims.claim(tmp_path, 0, 2, "8_0", 1001.0, mark=Mark.RELEASED)
    assert released is not None and json.loads(Path(claims.claim_path(tmp_path, 0, 2)).read_text())["released"]
    assert claims.read_lease(tmp_path, 0) == released
    Path(claims.claim_path(tmp_path, 0, 3)).write_text('{"owner": "9_0", "pid": "not a pid"}')
    assert claims.read_lease(tmp_path, 0) is None  # the newest claim does not read (yet): no error, no lease
