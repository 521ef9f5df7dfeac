"""The benchmark (`chain bench`): each backend and chain on a model suite, side by side.

Shipped with the package so that the console script works from any install;
`python benchmarks/run.py` in a checkout runs the same code.
"""
