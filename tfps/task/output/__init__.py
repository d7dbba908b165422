"""What the chief leaves: checkpoints (their step), the final export and evaluation, the
SavedModel versions written while training, the evaluation points."""
