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


def test_sft_accuracy_is_labelled_token_accuracy_and_held_out_exact_match_comes_from_the_manifest(tmp_path):
    sft = fake_run(tmp_path / "sft", [{"step": s, "loss": 1 / s, "accuracy": 0.9} for s in (1, 2)])
    (sft / "manifest.json").write_text(json.dumps(
        {"stage": "sft", "stats": {"base_accuracy": 0.25, "accuracy": 0.5}}))
    rm = fake_run(tmp_path / "rm", [{"step": 1, "loss": 0.6, "accuracy": 0.75}])
    (rm / "manifest.json").write_text(json.dumps({"stage": "rm", "stats": {"base_accuracy": 0.5, "accuracy": 1.0}}))
    write_report([sft, rm], tmp_path / "out", ReportConfig())
    md = (tmp_path / "out" / "summary.md").read_text()
    header = ("| run | steps | last loss | last token accuracy | last pair accuracy | held-out exact match "
              "| held-out pair accuracy |")
    assert header in md
    assert "| sft | 2 | 0.5 | 0.9 |  | 0.25 -> 0.5 |  |" in md
    assert "| rm | 1 | 0.6 |  | 0.75 |  | 0.5 -> 1 |" in md
    assert "last accuracy" not in md
