"""Tokenizers: one interface, the sentencepiece and tokenizer.json backends, chat templates, CJK, the batch encoder."""
