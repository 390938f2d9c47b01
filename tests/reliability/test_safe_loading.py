"""Nothing llmkit reads can run code: a pickle planted in a checkpoint or a YAML tag in a recipe
is refused (or never read), and the payload never runs."""
import os

import pytest
import torch
from typer.testing import CliRunner

from llmkit.checkpoints.loading import load_model
from llmkit.cli.app import build_app
from llmkit.errors import UserError
from llmkit.checkpoints import step_folders as ckpt
from llmkit.train.metrics import read_metrics
from tests.train.conftest import make_engine


class Payload:
    """Unpickling this runs `touch <marker>`."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def plant(path, marker) -> None:
    torch.save({"module": Payload(marker), "optimizer": None}, path)


@pytest.mark.parametrize("zero_stage", [0, 2])
def test_a_pickle_planted_in_deepspeed_state_is_refused_and_never_runs(tmp_path, zero_stage):
    run, marker = tmp_path / "run", tmp_path / "pwned"
    make_engine(run, max_steps=2, zero_stage=zero_stage, transformer=True).fit()
    planted = sorted((run / "step-00000002" / ckpt.DEEPSPEED).rglob("*.pt"))
    assert planted
    for path in planted:
        plant(path, marker)
    with pytest.raises(UserError, match="refusing to load .*step-00000002.*not written by llmkit"):
        make_engine(run, max_steps=4, zero_stage=zero_stage, transformer=True).fit()
    assert not marker.exists()


def test_an_untouched_checkpoint_still_resumes_through_the_safe_loader(tmp_path):
    make_engine(tmp_path / "run", max_steps=2, zero_stage=2, transformer=True).fit()
    resumed = make_engine(tmp_path / "run", max_steps=3, zero_stage=2, transformer=True)
    resumed.fit()
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [1, 2, 3]


def test_loading_a_model_reads_only_safetensors_and_json(tmp_path):
    run, marker = tmp_path / "run", tmp_path / "pwned"
    make_engine(run, max_steps=1, transformer=True).fit()
    step = run / "step-00000001"
    for path in [*(step / ckpt.DEEPSPEED).rglob("*.pt"), step / "pytorch_model.bin", step / "model.pt"]:
        plant(path, marker)
    model, _ = load_model(step, device="cpu")
    assert sum(p.numel() for p in model.parameters()) > 0
    assert not marker.exists()


def test_a_recipe_with_a_python_tag_exits_2_and_runs_nothing(tmp_path):
    marker = tmp_path / "pwned"
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f'clean:\n  min_chars: !!python/object/apply:os.system ["touch {marker}"]\n')
    (tmp_path / "a.txt").write_text("hello world\n")
    r = CliRunner().invoke(build_app(), ["ingest", str(tmp_path / "a.txt"), "--recipe", str(recipe),
                                         "-w", str(tmp_path / "ws")])
    assert r.exit_code == 2, r.output
    assert "recipe.yaml" in r.output and "Traceback" not in r.output
    assert not marker.exists()
