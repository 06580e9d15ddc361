"""From judged results to action: what to ship per target, what regressed against a baseline, shards merged first."""
