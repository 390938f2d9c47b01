"""`train_only: new_rows` (pretrain): only the embedding rows `llmkit extend-vocab` added train.

Stage 1 of the Chinese-LLaMA recipe: the new pieces' rows (initialised as the mean of the pieces
they replace) first learn alone, at a higher learning rate, while the model that reads them stays
as it was; a full continued pretraining `--from` that run follows. The new ids are the extended
tokenizer's (`extension.json`, which every checkpoint copies, so any later run of the model knows
them); an untied head's rows of those ids train too, a tied head is the embedding itself.

Every other parameter is frozen (no gradient, no optimizer state) and a hook zeroes the old rows'
gradient. AdamW's moments of a row whose gradient is always zero stay zero, so its update is zero:
the old rows stay bit for bit, provided nothing decays them. AdamW's decoupled weight decay
shrinks every row of a decayed matrix, gradient or not, so these matrices are left undecayed
(`optim.NO_DECAY`).
"""

from __future__ import annotations

from llmkit.checkpoints.new_rows import embeddings_and_heads, new_token_ids
from llmkit.errors import ConfigError
from llmkit.train.optim import NO_DECAY

TRAIN_ONLY = ("all", "new_rows")


def train_new_rows_only(model, from_step) -> list[int]:
    """Freeze `model` (loaded from `from_step`) but the rows extend-vocab added; their ids."""
    ids = new_token_ids(from_step) if from_step is not None else []
    if not ids:
        where = f"{from_step} has no rows added by `llmkit extend-vocab` (its tokenizer has no " \
                "extension.json)" if from_step is not None else "the run starts from no model (--from)"
        raise ConfigError(f"train_only=new_rows trains the rows `llmkit extend-vocab` added, but {where}; "
                          "start --from an extended model, or use train_only=all")
    matrices = {id(m.weight): m.weight for _, embedding, _, head in embeddings_and_heads(model)
                for m in (embedding, head) if m is not None}  # a tied head is the embedding: once
    for p in model.parameters():
        p.requires_grad_(False)
    for weight in matrices.values():
        weight.requires_grad_(True)
        setattr(weight, NO_DECAY, True)
        weight.register_hook(_old_rows_zeroed(weight.shape[0], ids))
    return ids


def _old_rows_zeroed(rows: int, ids: list[int]):
    import torch

    old = torch.ones(rows, 1, dtype=torch.bool)
    old[ids] = False

    def hook(grad):
        return grad.masked_fill(old.to(grad.device), 0)

    return hook
