"""Per-shape buckets for fixed-shape backends, between selection and the guard.

A graph with symbolic sizes runs its general (symbolic) winner; a shape called
`bucket_after` times gets the chain's fixed-shape candidates compiled for it, verified and
timed against the general path, and the fastest serves that shape when it wins. At most
`max_buckets` per graph, the least used evicted. Records in, records out: no import of
chain.select.core or chain.bench.
"""

from chain.report.bucket_stats import Bucket, BucketStats
from chain.run.buckets.buckets import Buckets
from chain.run.buckets.given import General, Selection
from chain.run.buckets.shapes import ShapeKey, specialize

__all__ = ["Bucket", "BucketStats", "Buckets", "General", "Selection", "ShapeKey", "specialize"]
