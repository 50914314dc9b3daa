"""The parallel composition: a strategy's layout, its engines wrapped around the model and the optimizer,
and what follows from parameters split over mesh dimensions (the global norm, whole-model state)."""
