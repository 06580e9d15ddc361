"""After the judge: explain failing cells (first divergent node) and try graph preparations that make them work."""
