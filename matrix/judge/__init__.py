"""Each cell judged: the run's one Judge, every verdict rule, the drift and latency measures behind them."""
