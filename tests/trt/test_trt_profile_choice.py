"""Which optimization profile serves a call (backends.tensorrt.runtime.profile_choice): the
first whose min..max contains every input's shape; none is a NoProfile naming the shapes."""

from __future__ import annotations

import pytest

from backends.tensorrt.conversion.profiles import Profile, Range, bucket_profiles
from backends.tensorrt.runtime.profile_choice import NoProfile, choose_profile, contains

PROFILES = bucket_profiles(
    {"ids": (2, "s1"), "w": (100, 32)}, {"s1": Range(2, 64)}, [{"s1": 16}, {"s1": 32}], 64
)  # lengths 2..16, 17..32, 33..64


@pytest.mark.parametrize(
    ("length", "index"), [(2, 0), (12, 0), (16, 0), (17, 1), (32, 1), (33, 2), (64, 2)]
)
def test_the_profile_whose_range_contains_the_length_is_chosen(length: int, index: int) -> None:
    assert choose_profile(PROFILES, {"ids": (2, length), "w": (100, 32)}) == index


@pytest.mark.parametrize(
    "shapes",
    [
        {"ids": (2, 65), "w": (100, 32)},  # past the last range
        {"ids": (2, 1), "w": (100, 32)},  # below the first
        {"ids": (3, 16), "w": (100, 32)},  # a fixed dim at another size
        {"ids": (2, 16, 1), "w": (100, 32)},  # another rank
        {"other": (2, 16)},  # an input the profiles do not know
    ],
)
def test_no_profile_containing_the_shapes_is_an_error_naming_them(shapes: dict) -> None:
    with pytest.raises(NoProfile, match="no TensorRT optimization profile contains") as info:
        choose_profile(PROFILES, shapes)
    assert str(next(iter(shapes.values()))) in str(info.value)
    assert "(2, 33), (2, 64)" in str(info.value)  # the ranges built, to see what is missing
    assert isinstance(info.value, RuntimeError)  # the chain's guard falls back on it


def test_the_first_of_several_containing_profiles_wins() -> None:
    wide = Profile({"x": ((1, 1), (1, 32), (1, 64))})
    narrow = Profile({"x": ((1, 8), (1, 8), (1, 8))})
    assert contains(wide, {"x": (1, 8)}) and contains(narrow, {"x": (1, 8)})
    assert choose_profile([wide, narrow], {"x": (1, 8)}) == 0
    assert choose_profile([narrow, wide], {"x": (1, 8)}) == 0
    assert choose_profile([narrow, wide], {"x": (1, 9)}) == 1
