"""Reporting: records, the report and its formats, the live report file, graph facts, and
`look` (HTML, trace, repro).
"""
