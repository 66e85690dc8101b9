"""Engine workers: each module is a process that serves the invocation protocol (docs/protocol.md)."""
