"""The training loop the core owns: the configuration, the cycle's pure functions (rewards, advantages, objective,
requests), checkpoints and the history recomputed from a run's records."""
