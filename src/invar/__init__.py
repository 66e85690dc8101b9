"""Invar: decide whether a changed numerical implementation may replace the trusted one, for a declared use."""

__version__ = "0.1.0"
