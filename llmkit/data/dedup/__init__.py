"""Deduplication: exact, SimHash and MinHash, as resumable sharded phases (see `stage.py`)."""
