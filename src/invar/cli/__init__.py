"""The `invar` command line."""
