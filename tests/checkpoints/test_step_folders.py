"""The step-folder format's weights files: the same weights give the same bytes in any process."""

import hashlib
import subprocess
import sys

WRITE = """
import sys, torch
from llmkit.checkpoints.step_folders import save_weights
e = torch.arange(12.0).reshape(3, 4)
save_weights(sys.argv[1], {"model.embed_tokens.weight": e, "lm_head.weight": e, "norm": torch.ones(4)},
             {"lm_head.weight": "model.embed_tokens.weight"})
"""


def test_the_same_weights_are_the_same_bytes_in_every_process(tmp_path):
    # safetensors writes metadata keys in a per-process hash order; four processes all but
    # surely see both orders of the two keys unless the header is sorted
    digests = set()
    for i in range(4):
        path = tmp_path / f"w{i}.safetensors"
        subprocess.run([sys.executable, "-c", WRITE, str(path)], check=True)
        digests.add(hashlib.sha256(path.read_bytes()).hexdigest())
    assert len(digests) == 1

    from llmkit.checkpoints.step_folders import read_weights

    weights = read_weights(tmp_path / "w0.safetensors")
    assert weights["lm_head.weight"] is weights["model.embed_tokens.weight"]
    assert weights["norm"].tolist() == [1.0] * 4
