"""Captured decoder buffers grow geometrically: length-sorted batches that get larger re-capture a few times."""

from types import SimpleNamespace

from nemo_fastdecode.graphs.owner import grown_shape


def test_first_capture_is_exact_then_each_dimension_at_least_doubles():
    assert grown_shape(None, 27, 300) == (27, 300)
    old = SimpleNamespace(batch_size=27, max_time=300)
    assert grown_shape(old, 30, 200) == (54, 300)  # more rows: doubled; frames kept
    assert grown_shape(old, 20, 320) == (27, 600)  # longer: doubled; rows kept
    assert grown_shape(old, 100, 900) == (100, 900)  # beyond double: exactly what is asked


def test_increasing_batch_sizes_capture_a_logarithmic_number_of_times():
    shape, captures = None, 0
    for batch_size in range(27, 129):  # length-sorted batches, shorter and more numerous
        if shape is None or batch_size > shape.batch_size:
            b, t = grown_shape(shape, batch_size, 100)
            shape, captures = SimpleNamespace(batch_size=b, max_time=t), captures + 1
    assert shape.batch_size >= 128
    assert captures <= 4
