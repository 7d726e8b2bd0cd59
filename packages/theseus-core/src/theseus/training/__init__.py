"""Training: the trainer, its optimizers, schedules, data strategy and checkpoints."""
