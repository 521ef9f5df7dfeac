"""Judging: right (float64 reference, eager's own error) and faster (timing, the speed rules).
Knows nothing of the chain's order.
"""
