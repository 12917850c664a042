"""A front-end replica's collector setting."""

import gc

from infergate.serving.gc_tuning import YOUNG_THRESHOLD, collect_young_objects_rarely


def test_only_the_youngest_generations_threshold_is_raised():
    before = gc.get_threshold()
    gc.set_threshold(700, 7, 9)
    try:
        collect_young_objects_rarely()
        assert gc.get_threshold() == (YOUNG_THRESHOLD, 7, 9)
        assert YOUNG_THRESHOLD > 700  # CPython's default, which it replaces
    finally:
        gc.set_threshold(*before)
