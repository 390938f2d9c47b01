import json

from llmkit.report import ReportConfig, write_report


def fake_run(path, metrics):
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("\n".join(json.dumps(m) for m in metrics) + "\n")
    return path


def test_report_overlays_runs_and_writes_pngs_and_summary(tmp_path):
    a = fake_run(tmp_path / "pretrain", [{"step": s, "loss": 5 / s, "lr": 1e-3} for s in range(1, 6)])
    b = fake_run(tmp_path / "dpo", [{"step": s, "loss": 0.69 - s / 100, "rewards/margins": s / 10}
                                    for s in range(1, 4)])
    written = write_report([a, b], tmp_path / "out", ReportConfig())
    names = sorted(p.name for p in written)
    assert names == ["loss.png", "lr.png", "rewards_margins.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in written)
    md = (tmp_path / "out" / "summary.md").read_text()
    assert "| pretrain | 5 | 1 |" in md and "| dpo | 3 | 0.66 |" in md
