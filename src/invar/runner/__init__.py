"""Driving engines: starting a package's worker, seeding requests, sampling the population, executing a contract's
plan and resuming it. Every command that runs an engine goes through here; the CLI only parses, shows progress and
prints."""
