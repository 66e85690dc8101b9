"""Helpers shared by tests: small tokenizers and models built at test time."""
