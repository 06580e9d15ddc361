"""Ground truth: the float64 reference (in its own guarded job) and the --source column from the training framework."""

# The --source column's target name in results (its variant is the framework: sb3, torch, ...). Here, not in
# source.py: the report's and assist's modules ask for the name on every run, and source.py imports the column's jobs.
SOURCE_TARGET = "source"
