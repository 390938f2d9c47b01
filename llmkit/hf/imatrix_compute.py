"""An importance matrix computed by llmkit's own model, written in llama.cpp's imatrix GGUF format
(`llmkit export --format gguf --quant q4_k_m --set imatrix.data=DATASET`).

The definition is llama.cpp's (tools/imatrix/imatrix.cpp, `collect_imatrix`): for every weight
matrix of a block (`blk.N.*`; the output matrix is left out, as llama-imatrix leaves it out
without --process-output), the sum over the calibration tokens of the squared input activation
of each input column (`<name>.in_sum2`), and how many tokens were summed (`<name>.counts`). A
mixture-of-experts matrix holds one row of sums and one count per expert, each expert counting
only the tokens routed to it (llama.cpp's MUL_MAT_ID). The quantiser weighs each column by
in_sum2 / count. Names are the GGUF tensor names llmkit's export writes (`blk.0.attn_q.weight`);
an input column is the same column in both layouts (export permutes the rows of attn_q/attn_k,
never their columns).

The model runs in float32 without gradients, forward pre-hooks on its linear layers reading each
input; the calibration text is the dataset's `text` column in a fixed shuffled order (so a
dataset written zh first, en after gives both), each document as `llmkit tokenize` writes it,
the documents concatenated and cut into chunks of `chunk` tokens (llama-imatrix's context size),
`batch` chunks per forward pass, at most `tokens` tokens. The file carries llama.cpp's metadata
(`general.type = imatrix`, `imatrix.datasets`, `imatrix.chunk_count`, `imatrix.chunk_size`), which
llama-quantize requires of a GGUF imatrix.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

from llmkit.checkpoints.loading import load
from llmkit.data.io import dataset_files, read_table
from llmkit.errors import ConfigError, UserError
from llmkit.hf.gguf_export import GGUF_ARCH, gguf_layout
from llmkit.model.lm_scoring import text_documents

IMATRIX_FILE = "imatrix.gguf"
AUTO_DATASETS = ("filtered", "decontaminated", "dedup", "clean", "raw")  # the pipeline's text, last stage first
MIN_CHUNK = 16  # llama-imatrix skips matrix products of fewer than 16 tokens


@dataclass
class ImatrixConfig:
    file: str = ""  # an importance matrix of llama.cpp's (its GGUF format or the legacy .dat); `imatrix=FILE` is the same
    data: str = ""  # compute one with the model: a workspace text dataset (name or path); `auto` = the workspace's filtered, decontaminated, dedup, clean or raw (the first present)
    tokens: int = 65536  # calibration tokens at most
    chunk: int = 512  # tokens per chunk (llama-imatrix's context size)
    batch: int = 4  # chunks per forward pass
    seed: int = 0  # the order the dataset's rows are read in

    def __post_init__(self):
        if self.file and self.data:
            raise ConfigError("export imatrix.file and imatrix.data both set: give an importance matrix file or "
                              "a dataset to compute one from, not both")
        if self.chunk < MIN_CHUNK:
            raise ConfigError(f"export imatrix.chunk must be >= {MIN_CHUNK} (llama-imatrix skips products of fewer "
                              f"tokens), got {self.chunk}")
        if self.tokens < self.chunk:
            raise ConfigError(f"export imatrix.tokens ({self.tokens}) must be >= imatrix.chunk ({self.chunk})")
        if self.batch < 1:
            raise ConfigError(f"export imatrix.batch must be >= 1, got {self.batch}")


def imatrix_settings(value) -> ImatrixConfig:
    """ExportConfig.imatrix, a file path (the flat `imatrix=FILE`) or the section, as the section."""
    return value if isinstance(value, ImatrixConfig) else ImatrixConfig(file=str(value or ""))


def calibration_dataset(workspace, data: str) -> Path:
    """The dataset folder `imatrix.data` names (`auto`: the workspace's latest text); a UserError
    naming what is missing."""
    if data == "auto":
        found = [workspace.path(n) for n in AUTO_DATASETS if dataset_files(workspace.path(n))]
        if not found:
            raise UserError(f"imatrix.data=auto: workspace {workspace.root} has no text dataset "
                            f"({', '.join(AUTO_DATASETS)}): name one with --set imatrix.data=DATASET "
                            "(a dataset folder with a `text` column)")
        return found[0]
    path = workspace.named(data)
    if not dataset_files(path):
        raise UserError(f"imatrix.data={data}: {path} is not a dataset (no part-*.parquet files): name a text "
                        "dataset of the workspace (e.g. clean) or its folder with --set imatrix.data=DATASET")
    return path


def calibration_chunks(tokenizer, dataset: Path, cfg: ImatrixConfig):
    """[n_chunks, chunk] int64 token ids of the dataset's texts (see the module docstring)."""
    import numpy as np
    import torch

    table = read_table(dataset)
    if "text" not in table.column_names:
        raise UserError(f"imatrix.data: {dataset} has no `text` column (columns: {', '.join(table.column_names)})")
    texts = table.column("text").to_pylist()
    order = np.random.default_rng(cfg.seed).permutation(len(texts))
    ids: list[int] = []
    for start in range(0, len(order), 64):
        batch = [texts[i] for i in order[start:start + 64] if texts[i]]
        ids += [t for doc in text_documents(tokenizer, batch) for t in doc] if batch else []
        if len(ids) >= cfg.tokens:
            break
    n_chunks = min(len(ids), cfg.tokens) // cfg.chunk
    if n_chunks == 0:
        raise UserError(f"imatrix.data: {dataset} holds {len(ids)} tokens, fewer than one chunk of {cfg.chunk}: "
                        "give a larger dataset or a smaller --set imatrix.chunk=N")
    return torch.tensor(ids[:n_chunks * cfg.chunk], dtype=torch.int64).view(n_chunks, cfg.chunk)


def gguf_matrix_names(model, arch: str) -> dict[str, tuple[str, int | None]]:
    """llmkit linear layer name -> (the GGUF name of the matrix it multiplies by, its expert index
    or None), for the matrices of the blocks (what llama-imatrix collects)."""
    import gguf
    import torch

    names = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, arch.upper()), model.config.n_layers)
    out = {}
    for module_name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        expert = re.search(r"\.experts\.(\d+)\.", module_name)
        merged = module_name if expert is None else module_name.replace(expert.group(0), ".experts.")
        gguf_name = names.get_name(merged + ".weight", try_suffixes=(".weight",))
        if gguf_name is not None and gguf_name.startswith("blk."):
            out[module_name] = (gguf_name, None if expert is None else int(expert.group(1)))
    return out


class _OutputReached(Exception):
    """Raised at the output matrix: its logits are not needed for the statistics."""


def compute_imatrix(model, chunks, arch: str, batch: int = 4) -> dict:
    """{GGUF name: (in_sum2 float64 [n_mat, columns], counts int64 [n_mat])} of `model` (float32,
    no gradients) over `chunks` ([n, chunk] token ids), `batch` chunks per forward pass."""
    import torch

    layers = gguf_matrix_names(model, arch)
    modules = dict(model.named_modules())
    n_mat: dict[str, int] = {}
    for gguf_name, expert in layers.values():
        n_mat[gguf_name] = max(n_mat.get(gguf_name, 1), (expert or 0) + 1)
    stats = {name: (torch.zeros(n, modules[next(m for m, (g, _) in layers.items() if g == name)].in_features,
                                dtype=torch.float64), torch.zeros(n, dtype=torch.int64)) for name, n in n_mat.items()}

    def collect(gguf_name, row):
        def hook(module, inputs):
            x = inputs[0].detach().reshape(-1, module.in_features)
            sums, counts = stats[gguf_name]
            sums[row] += x.double().square().sum(0)
            counts[row] += x.shape[0]
        return hook

    def stop(module, inputs):
        raise _OutputReached

    handles = [modules[m].register_forward_pre_hook(collect(g, e or 0)) for m, (g, e) in layers.items()]
    if isinstance(getattr(model, "lm_head", None), torch.nn.Linear):
        handles.append(model.lm_head.register_forward_pre_hook(stop))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for start in range(0, len(chunks), batch):
                try:
                    model(chunks[start:start + batch])
                except _OutputReached:
                    pass
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    silent = [name for name, (_, counts) in stats.items() if int(counts.sum()) == 0]
    if silent:  # a path that multiplies without calling the module (a fused kernel) would go unseen
        raise RuntimeError(f"the importance matrix saw no input for {', '.join(silent[:4])}")
    return {name: (sums.numpy(), counts.numpy()) for name, (sums, counts) in stats.items()}


def write_imatrix_gguf(path: Path, stats: dict, datasets: list[str], chunk_count: int, chunk_size: int) -> None:
    """llama-imatrix's GGUF output: `general.type = imatrix`, the `imatrix.*` keys, and per matrix
    (names sorted, as llama.cpp stores them) `<name>.in_sum2` [n_mat, columns] and `<name>.counts`
    [n_mat, 1], both F32."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), arch="imatrix")
    writer.kv_data[0].pop(gguf.Keys.General.ARCHITECTURE, None)  # llama-imatrix writes no architecture
    writer.add_type(gguf.GGUFType.IMATRIX)
    writer.add_array(gguf.Keys.IMatrix.DATASETS, list(datasets))
    writer.add_uint32(gguf.Keys.IMatrix.CHUNK_COUNT, chunk_count)
    writer.add_uint32(gguf.Keys.IMatrix.CHUNK_SIZE, chunk_size)
    for name in sorted(stats):
        sums, counts = stats[name]
        writer.add_tensor(f"{name}.in_sum2", np.ascontiguousarray(sums, dtype=np.float32))
        writer.add_tensor(f"{name}.counts", np.asarray(counts, dtype=np.float32).reshape(-1, 1))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def imatrix_inputs(workspace, value) -> list[Path]:
    """The calibration dataset an export reads (for its manifest's inputs), or none."""
    settings = imatrix_settings(value)
    return [calibration_dataset(workspace, settings.data)] if settings.data else []


def export_imatrix(workspace, value, step_dir: Path, out_dir: Path) -> tuple[str, dict | None]:
    """The importance matrix file an export quantises with: imatrix.file as given, or, with
    imatrix.data, `out_dir/imatrix.gguf` computed by the checkpoint's model (returned with what
    went into it, for the manifest). ("", None) where none is asked for."""
    settings = imatrix_settings(value)
    if not settings.data:
        return settings.file, None
    dataset = calibration_dataset(workspace, settings.data)
    started = time.perf_counter()
    model, tokenizer = load(step_dir)
    family, _ = gguf_layout(model.config, step_dir)  # refuses what the GGUF export refuses, before the work
    chunks = calibration_chunks(tokenizer, dataset, settings)
    stats = compute_imatrix(model.float(), chunks, GGUF_ARCH[family], settings.batch)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / IMATRIX_FILE
    write_imatrix_gguf(path, stats, [str(dataset)], len(chunks), settings.chunk)
    record = {"file": path.name, "dataset": str(dataset), "chunks": len(chunks), "chunk": settings.chunk,
              "tokens": int(chunks.numel()), "matrices": len(stats),
              "seconds": round(time.perf_counter() - started, 1)}
    print(f"imatrix: {len(stats)} matrices from {chunks.numel()} tokens of {dataset} ({len(chunks)} chunks of "
          f"{settings.chunk}), {record['seconds']} s -> {IMATRIX_FILE} beside the model file")
    return str(path), record
