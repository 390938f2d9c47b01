"""Hugging Face transformers interchange: `llmkit export` (export.py, with its parity probe in
parity.py) and `llmkit import` (import_.py). The model's config and weight names map in
mapping.py, tokenizers in tokenizer.py; folder.py names the files of a transformers folder."""
