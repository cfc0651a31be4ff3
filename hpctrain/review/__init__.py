"""Login-node review commands: status, report, cancel, tensorboard. Never imports torch."""
