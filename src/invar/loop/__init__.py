"""The training loop the core owns: advantages, the objective, and (later) the cycle itself."""
