"""A full disk mid-stage: a clear message, exit 2, earlier artifacts intact, nothing marked done."""

import errno
import json

from typer.testing import CliRunner

from llmkit.cli.app import build_app
from llmkit.data import io
from tests.conftest import write_jsonl


def test_disk_full_during_clean_exits_2_and_leaves_raw_intact(tmp_path, monkeypatch):
    ws = tmp_path / "ws"
    src = write_jsonl(tmp_path / "d.jsonl", [{"text": "The cat sat on the mat and it was "
                                                      "a very good day for all of us. " * 8}])
    app = build_app()
    assert CliRunner().invoke(app, ["ingest", str(src), "-w", str(ws)]).exit_code == 0
    raw_manifest = (ws / "raw" / "manifest.json").read_bytes()

    def full(self, table):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(io.DatasetWriter, "write", full)
    r = CliRunner().invoke(app, ["clean", "-w", str(ws)])
    assert r.exit_code == 2
    assert "disk full" in r.output and "Traceback" not in r.output
    assert (ws / "raw" / "manifest.json").read_bytes() == raw_manifest
    assert not (ws / "clean").exists() and not list(ws.glob("clean.tmp-*"))
    assert not (ws / "clean.lock").exists()
    assert json.loads(raw_manifest)["stats"]["rows_out"] == 1
