"""Running a winner: the guard, the CUDA-graphs stage, the run-time checks (watch) and per-
shape buckets.
"""
