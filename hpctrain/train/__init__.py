"""Runs on the compute node: the trainer and what it builds. The only package that imports torch."""
