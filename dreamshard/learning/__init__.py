"""Learning: features, DreamShard's cost network, policy and estimated MDP, the training loops,
NeuroShard's pre-trained cost models, and checkpoints."""
