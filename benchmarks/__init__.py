"""The benchmark: a model suite, an interleaved timing harness, report writers and the CLI."""
