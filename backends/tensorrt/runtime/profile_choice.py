"""Which optimization profile serves a call: the first whose min..max contains every input's
shape. Pure (no TensorRT), so the choice is testable on CPU; the engine module applies it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from backends.tensorrt.conversion.profiles import Profile, Shape


class NoProfile(RuntimeError):
    """No profile of the engine covers this call's shapes (the chain's guard falls back)."""


def contains(profile: Profile, shapes: Mapping[str, Shape]) -> bool:
    """Whether every input's shape lies within the profile's min and max, dim by dim."""
    for name, shape in shapes.items():
        if name not in profile.shapes:
            return False
        low, _, high = profile.shapes[name]
        if len(shape) != len(low) or not all(
            lo <= s <= hi for lo, s, hi in zip(low, shape, high, strict=True)
        ):
            return False
    return True


def choose_profile(profiles: Sequence[Profile], shapes: Mapping[str, Shape]) -> int:
    """The index of the first profile containing `shapes`; NoProfile naming the shapes and
    the ranges built when none does."""
    for index, profile in enumerate(profiles):
        if contains(profile, shapes):
            return index
    built = [{n: (lo, hi) for n, (lo, _, hi) in p.shapes.items()} for p in profiles]
    raise NoProfile(
        f"no TensorRT optimization profile contains the input shapes {dict(shapes)}; "
        f"built (min, max): {built}"
    )
