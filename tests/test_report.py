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


# -- where a report goes: its own folder, never over a report of other runs -------------------------

def report(ws, *args):
    from typer.testing import CliRunner

    from llmkit.cli.app import build_app

    return CliRunner().invoke(build_app(), ["report", *args, "-w", str(ws)])


def two_runs(ws):
    fake_run(ws / "pretrain", [{"step": s, "loss": 5 / s, "lr": 1e-3} for s in (1, 2)])
    fake_run(ws / "sft", [{"step": 1, "loss": 1.0, "accuracy": 0.5}])


def test_reports_of_other_runs_each_go_to_their_own_folder(tmp_path):
    ws = tmp_path / "ws"
    two_runs(ws)
    assert report(ws, "pretrain", "sft").exit_code == 0
    assert report(ws, "sft").exit_code == 0
    both, alone = (ws / "report/pretrain+sft/summary.md").read_text(), (ws / "report/sft/summary.md").read_text()
    assert "| pretrain |" in both and "| sft |" in both
    assert "| sft |" in alone and "| pretrain |" not in alone
    assert json.loads((ws / "report/sft/report.json").read_text())["runs"] == ["sft"]


def test_a_named_report_of_other_runs_is_refused_and_one_of_the_same_runs_replaced(tmp_path):
    ws = tmp_path / "ws"
    two_runs(ws)
    assert report(ws, "pretrain", "sft", "--set", "name=mine").exit_code == 0
    before = (ws / "report/mine/summary.md").read_text()
    r = report(ws, "sft", "--set", "name=mine")
    assert r.exit_code == 2 and "holds the report of pretrain, sft" in r.output and "--set name=NAME" in r.output
    assert (ws / "report/mine/summary.md").read_text() == before and (ws / "report/mine/lr.png").is_file()
    (ws / "pretrain/metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 3.0}) + "\n")  # no lr now
    assert report(ws, "pretrain", "sft", "--set", "name=mine").exit_code == 0
    assert not (ws / "report/mine/lr.png").exists()  # the plot the new report does not draw is gone


def test_a_report_name_is_a_folder_name_and_a_folder_llmkit_did_not_write_is_kept(tmp_path):
    ws = tmp_path / "ws"
    two_runs(ws)
    r = report(ws, "sft", "--set", "name=../sft")
    assert r.exit_code == 2 and "report name must be a folder name" in r.output
    (ws / "report/notes").mkdir(parents=True)
    (ws / "report/notes/plan.txt").write_text("mine")
    r = report(ws, "sft", "--set", "name=notes")
    assert r.exit_code == 2 and "is not a report llmkit wrote" in r.output
    assert (ws / "report/notes/plan.txt").read_text() == "mine"
