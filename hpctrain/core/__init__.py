"""Shared by every room: paths, states, events, summaries, atomic writes. No torch, no Hydra internals."""
