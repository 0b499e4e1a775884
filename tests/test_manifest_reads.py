"""One ingest reads each collector rank manifest (``rank{R}.manifest.json``) once: N reads for a
folder of N ranks, not one folder read per trace (and per check, and per Flight Recorder dump) --
N x N, ~3 GB of JSON at 1,024 ranks. Counted on a real ingest of a shipped 4-rank folder (traces,
rank manifests, FR dumps); the checks the manifests feed still refuse what they refused."""
from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest
from conftest import TRACES

import traceanalyzer as ta
from traceanalyzer.errors import TraceInputError

RUN = "ddp_gloo_4rank"


@pytest.fixture
def manifest_reads(monkeypatch):
    """Counts the reads of rank manifests (whoever reads them: every reader goes through Path.read_text)."""
    reads: Counter = Counter()
    real = Path.read_text

    def counted(self, *args, **kwargs):
        if self.name.startswith("rank") and self.name.endswith(".manifest.json"):
            reads[self.name] += 1
        return real(self, *args, **kwargs)
    monkeypatch.setattr(Path, "read_text", counted)
    return reads


def test_each_rank_manifest_is_read_once_per_ingest(tmp_path, manifest_reads):
    folder = TRACES / RUN
    names = sorted(p.name for p in folder.glob("rank*.manifest.json"))
    assert len(names) == 4 and len(list(folder.glob("rank*.fr.json"))) == 4
    rep = ta.ingest([folder], tmp_path / "store", run=RUN, progress=False, workers=1)   # in this process: counted
    assert len(rep.traces) == 4 and len(rep.sidecars) == 4          # every trace and FR dump, ranks from the manifests
    assert dict(manifest_reads) == {n: 1 for n in names}
    assert {t.job["run_id"] for t in rep.traces} == {RUN}           # the collector's run id, from the manifests


def test_the_checks_still_refuse_a_wrong_manifest(tmp_path, manifest_reads):
    """The driver hands each task its own part of the manifests: a manifest that gives a trace
    another rank, or an unreadable one, is refused as before, naming the file."""
    d = tmp_path / "run"
    shutil.copytree(TRACES / RUN, d)
    doc = json.loads((d / "rank2.manifest.json").read_text())
    doc["rank"] = 3                                                  # lists rank 2's trace as rank 3's
    (d / "rank2.manifest.json").write_text(json.dumps(doc))
    for fr in d.glob("*.fr.json"):
        fr.unlink()
    with pytest.raises(TraceInputError, match="rank mismatch: rank2.manifest.json says this is rank 3's trace") as e:
        ta.ingest([d], tmp_path / "store", run="x", progress=False, workers=1)
    assert Path(e.value.path).name == "rank2.window0.pt.trace.json.gz"
    (d / "rank2.manifest.json").write_text("{not json")
    with pytest.raises(TraceInputError, match="unreadable rank manifest") as e:
        ta.ingest([d], tmp_path / "store", run="x", progress=False, workers=1)
    assert Path(e.value.path).name == "rank2.manifest.json"
    assert not (tmp_path / "store").exists()
