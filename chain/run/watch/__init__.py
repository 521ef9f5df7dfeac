"""Run-time checks of a winning backend (records in, records out; no import of chain.select.core).

`Watch` checks every call of a winner cheaply (`expect`), re-verifies a sample of calls
against eager on the real arguments (`schedule`, `reverify`), keeps what a graph writes so
a failed call can be undone (`writes`), and counts all of it on the graph's record (`stats`);
`fast` runs the usual call of most graphs as one closure with the same checks.
"""

from chain.run.watch.expect import Expected
from chain.run.watch.stats import RunChecks
from chain.run.watch.watch import Demoted, TooSlow, Watch
from chain.run.watch.writes import InputsWritten, Writes

__all__ = ["Demoted", "Expected", "InputsWritten", "RunChecks", "TooSlow", "Watch", "Writes"]
