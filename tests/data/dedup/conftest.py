from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from llmkit.data.io import DatasetWriter, read_table
from llmkit.core.workspace import Workspace


@dataclass
class Planted:
    docs: int
    parts: int
    seed: int


def make_dataset(root: Path, texts, *, parts: int = 1, name: str = "clean", seed: int = 0):
    """A dataset artifact of `texts` (ids doc0, doc1, …) split into `parts` part files."""
    b = Workspace(root).builder(name, stage="ingest", config=Planted(len(texts), parts, seed),
                                quiet=True)
    with b:
        writer = DatasetWriter(b.dir, bytes_per_part=1)  # every write is its own part
        for chunk in np.array_split(np.arange(len(texts)), parts):
            writer.write(pa.table({"id": [f"doc{i}" for i in chunk],
                                   "text": [texts[i] for i in chunk],
                                   "source": ["planted"] * len(chunk),
                                   "score": pa.array(chunk.astype(float))}))
        writer.close()
    return b.final


def predicted_clusters(artifact: Path, n: int) -> np.ndarray:
    """Cluster label per document: the index of the document it duplicates, or its own."""
    labels = np.arange(n)
    removed = read_table(artifact / "removed", columns=["id", "duplicate_of"])
    for doc, kept in zip(removed.column("id").to_pylist(),
                         removed.column("duplicate_of").to_pylist()):
        labels[int(doc[3:])] = int(kept[3:])
    return labels
