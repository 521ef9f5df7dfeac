"""Regions of one graph served by different backends, chosen by measurement (issue 49):
`cut` cuts a graph at module boundaries, `trials` times each distinct region under each
candidate, `mix` stitches the cheapest assignment and keeps it only when it is faster."""
