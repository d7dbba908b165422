"""What the chief leaves: checkpoints (their step), the final export and evaluation, the
SavedModel versions written while training, the evaluation points, the delta checkpoints
between full ones (delta: on disk and at a restore; delta_hook: the chief's saves)."""
