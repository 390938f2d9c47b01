"""The network: the Transformer and its mixers, kernels, decoding, LM scoring, quantised layers, the reward head."""
