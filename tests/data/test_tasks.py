"""Every data stage is made of tasks (llmkit.data.pipeline.SplitTasks and its kin): split over
--rank/--world-size, or spread over --workers processes, it gives the one-process artifact."""

import pytest

from llmkit.data.dedup.phases import PHASES
from tests.data.stage_tasks import STAGES, assert_same_artifact, build_workspace, llmkit


@pytest.fixture(scope="module")
def ws(tmp_path_factory, tok):
    return build_workspace(tmp_path_factory.mktemp("tasks") / "ws", tok)


@pytest.mark.parametrize("stage", STAGES)
def test_three_ranks_then_a_plain_run_give_the_one_process_artifact(ws, stage):
    artifact, args = STAGES[stage]
    out = ["--out", f"{artifact}_ranks"]
    for phase in PHASES if stage == "dedup" else [None]:
        for rank in range(3):
            r = llmkit(ws, *args, *out, "--rank", rank, "--world-size", 3,
                       *(["--phase", phase] if phase else []))
            assert f"rank {rank}/3 done" in r.output
    assert not (ws / f"{artifact}_ranks").exists()  # a rank commits nothing
    r = llmkit(ws, *args, *out)
    if stage != "ppl-filter":  # its ranks score; the plain run filters
        assert "tasks already done (resumed)" in r.output
    assert_same_artifact(ws / artifact, ws / f"{artifact}_ranks")


@pytest.mark.parametrize("stage", ["ingest", "ppl-filter"])
def test_tasks_on_two_worker_processes_give_the_one_process_artifact(ws, stage):
    artifact, args = STAGES[stage]
    llmkit(ws, *args, "--out", f"{artifact}_workers", "--workers", 2)
    assert_same_artifact(ws / artifact, ws / f"{artifact}_workers")
