"""Ground truth: the float64 reference (in its own guarded job) and the --source column from the training framework."""
