"""Built-in data sets: synthetic tasks with a real learnable signal, made in memory (no download)."""
