SNAPSHOT_BYTES = 1

class WeightsDamaged(RuntimeError):
    pass
