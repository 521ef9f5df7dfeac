"""Selection: the Chain class, each candidate's attempt (compile, first run, verdict),
resolving names, options, concrete sizes, recompiles, worker threads, isolation.
"""
