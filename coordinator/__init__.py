"""Lockstep coordinator: the MetaService that hands out global barriers, and the `lockstep` CLI."""
