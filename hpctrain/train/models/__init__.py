"""Built-in models. Each returns logits; the trainer applies cross-entropy against the targets."""
