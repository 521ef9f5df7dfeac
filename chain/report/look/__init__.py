"""Ways to look at what the chain did: an HTML report, structured-trace artifacts, repros.

This part reads records (chain.report.records, chain.report); it never imports chain.select.core.
"""
