"""The engine's audio inbox (streaming/inbox.py): pushes copied once into a host log, each cycle's bytes taken in push
order up to a limit per stream, the rest kept in order for later cycles, dropped streams forgotten; and the front end
appending staged records (several per stream) as it appends the same audio in one piece."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nemo_fastdecode.streaming.frontend import AudioFrontEnd
from nemo_fastdecode.streaming.inbox import AudioInbox, earlier_in_slot

pytestmark = pytest.mark.usefixtures("single_thread")


def _taken(staged) -> dict[int, bytes]:
    """``{slot: bytes}`` of staged records, joined in record order."""
    out: dict[int, bytes] = {}
    for i, slot in enumerate(staged.slots.tolist()):
        out[slot] = out.get(slot, b"") + staged.payload(i).tobytes()
    return out


def test_earlier_in_slot_sums_each_slots_earlier_records():
    slots = np.array([3, 1, 3, 3, 1, 0])
    sizes = np.array([10, 20, 30, 40, 50, 60])
    assert earlier_in_slot(slots, sizes).tolist() == [0, 0, 10, 40, 20, 0]
    assert earlier_in_slot(np.array([2, 0, 1]), np.array([5, 6, 7])).tolist() == [0, 0, 0]


def test_take_hands_over_each_streams_first_bytes_and_keeps_the_rest_in_order():
    inbox = AudioInbox(4, torch.device("cpu"))
    rng = np.random.default_rng(0)
    sent: dict[int, bytes] = {0: b"", 1: b"", 2: b""}
    for _ in range(12):  # interleaved pushes of three streams
        slot = int(rng.integers(0, 3))
        data = rng.integers(0, 256, int(rng.integers(1, 40)) * 2, dtype=np.uint8).tobytes()
        inbox.write(slot, data)
        sent[slot] += data
    assert inbox.pending_bytes[:3].tolist() == [len(sent[s]) for s in range(3)]
    inbox.write(3, b"\x01\x02")
    inbox.drop(3)  # a closed stream: its bytes are never handed over
    assert inbox.pending_bytes[3] == 0
    staged = inbox.take(np.array([0, 1, 3]), np.array([10, 10**6, 10**6]))
    got = _taken(staged)
    assert set(got) == {0, 1} and got[0] == sent[0][:10] and got[1] == sent[1]
    assert (staged.offsets % 4 == 0).all()  # float payloads can be viewed in place
    inbox.write(0, b"\xaa\xbb")  # a push while the cycle steps: behind what was left of stream 0
    assert inbox.pending_bytes[:3].tolist() == [len(sent[0]) - 10 + 2, 0, len(sent[2])]
    got = _taken(inbox.take(np.array([0, 2]), np.array([10**6, 10**6])))
    assert got == {0: sent[0][10:] + b"\xaa\xbb", 2: sent[2]}
    assert inbox.pending_bytes.tolist() == [0, 0, 0, 0]
    assert inbox.take(np.array([0, 1, 2]), np.array([10, 10, 10])) is None  # nothing waits


def test_a_slot_reopened_after_a_drop_gets_only_its_new_bytes():
    inbox = AudioInbox(2, torch.device("cpu"))
    inbox.write(1, b"old!")
    inbox.drop(1)
    inbox.write(1, b"new!")
    assert _taken(inbox.take(np.array([1]), np.array([100]))) == {1: b"new!"}


def test_drops_forget_only_the_dropped_slots_records_so_far():
    """Two drops of one slot in one cycle, single and batched pushes around them: the other streams keep every byte,
    the dropped one only what came after its last drop."""
    inbox = AudioInbox(3, torch.device("cpu"))
    inbox.write(0, b"a0")
    inbox.write(1, b"b0")
    inbox.drop(1)
    inbox.write(1, b"b1")
    inbox.write(0, b"a1")
    inbox.drop(1)
    inbox.write(1, b"b2")
    inbox.write_many(np.array([2, 1]), b"c0b3", np.array([0, 2]), np.array([2, 4]))
    assert inbox.pending_bytes.tolist() == [4, 4, 2]
    assert _taken(inbox.take(np.array([0, 1, 2]), np.array([100, 100, 100]))) == {0: b"a0a1", 1: b"b2b3", 2: b"c0"}


def test_staged_records_append_as_the_same_audio_in_one_piece(preprocessor):
    """Several records per stream in one append (int16 and float32 streams) give the features of the whole audio
    appended at once, and the rows land in each stream's ring one after another."""
    rng = np.random.default_rng(2)
    pcm = (rng.standard_normal(4000) * 4000).astype("<i2")
    floats = (rng.standard_normal(3000) * 0.2).astype("<f4")
    whole = AudioFrontEnd(preprocessor, num_slots=2, max_push_seconds=0.5)
    pieces = AudioFrontEnd(preprocessor, num_slots=2, max_push_seconds=0.5)
    inbox = AudioInbox(2, torch.device("cpu"))
    for front in (whole, pieces):
        front.open(0)
        front.open(1, sample_format="float32")
    whole.append({0: pcm.tobytes(), 1: floats.tobytes()})
    for lo, hi in ((0, 1000), (1000, 1001), (1001, 3000), (3000, 4000)):
        inbox.write(0, pcm[lo:hi].tobytes())
        inbox.write(1, floats[lo : min(hi, 3000)].tobytes())
    staged = inbox.take(np.array([0, 1]), np.array([10**6, 10**6]))
    assert len(staged.slots) == 7  # the float stream's last piece is empty
    pieces.append_staged(staged)
    assert [pieces.samples_received(s) for s in (0, 1)] == [4000, 3000]
    a, b = whole.features(flush=[0, 1]), pieces.features(flush=[0, 1])
    assert a.features.shape[1] > 0
    assert torch.equal(a.features, b.features) and a.counts.tolist() == b.counts.tolist()


def test_staged_audio_is_checked_before_anything_is_appended(preprocessor):
    front = AudioFrontEnd(preprocessor, num_slots=2, max_push_seconds=0.1)
    front.open(0)
    front.open(1, sample_format="float32")
    inbox = AudioInbox(2, torch.device("cpu"))
    inbox.write(0, bytes(200))
    inbox.write(1, np.array([0.5, np.nan], dtype="<f4").tobytes())
    with pytest.raises(ValueError, match="stream 1: non-finite sample nan at sample 1"):
        front.append_staged(inbox.take(np.array([0, 1]), np.array([1000, 1000])))
    inbox.write(0, bytes(2 * 2100))  # more than the ring holds between two features() calls (0.1 s + a frame)
    with pytest.raises(ValueError, match="stream 0: 2100 new samples exceed"):
        front.append_staged(inbox.take(np.array([0]), np.array([10**6])))
    inbox.write(0, bytes(3))
    with pytest.raises(ValueError, match="partial sample"):
        front.append_staged(inbox.take(np.array([0]), np.array([10])))
    assert [front.samples_received(s) for s in (0, 1)] == [0, 0]  # nothing was appended


def test_write_many_is_write_in_order_adjacent_or_not():
    """A batch's pieces (adjacent: one copy; apart: one copy each) are the same records as one write() per piece."""
    block = bytes(range(200)) * 4
    slots = np.array([2, 0, 2, 1])
    for starts, stops in (([0, 10, 30, 36], [10, 30, 36, 100]), ([4, 50, 300, 600], [10, 52, 340, 700])):
        starts, stops = np.array(starts), np.array(stops)
        one, many = AudioInbox(3, torch.device("cpu")), AudioInbox(3, torch.device("cpu"))
        for slot, start, stop in zip(slots.tolist(), starts.tolist(), stops.tolist(), strict=True):
            one.write(slot, block[start:stop])
        many.write_many(slots, block, starts, stops)
        expected = [int((stops - starts)[slots == slot].sum()) for slot in range(3)]
        assert many.pending_bytes.tolist() == one.pending_bytes.tolist() == expected
        everything = np.array([0, 1, 2]), np.array([10**6] * 3)
        assert _taken(many.take(*everything)) == _taken(one.take(*everything))


def test_bytes_left_behind_stay_in_order_over_many_cycles_and_float_records_stay_aligned():
    """Cycles that take a part of each stream's bytes (some streams not at all) while batches and single pushes keep
    coming: every take is each stream's next bytes, as a per-stream queue would hand them over, and float32 records
    (slot 3) stay at 4-byte aligned offsets after waiting in the stream's backlog."""
    rng = np.random.default_rng(5)
    inbox = AudioInbox(4, torch.device("cpu"))
    queued: dict[int, bytes] = {slot: b"" for slot in range(4)}
    handed = 0
    for _ in range(40):
        for _ in range(int(rng.integers(1, 4))):  # network batches of int16 pushes, side by side in one block
            slots = rng.integers(0, 3, int(rng.integers(1, 6)))
            sizes = rng.integers(0, 30, slots.size) * 2
            stops = np.cumsum(sizes)
            block = rng.integers(0, 256, int(stops[-1]), dtype=np.uint8).tobytes()
            inbox.write_many(slots, block, stops - sizes, stops)
            for slot, start, stop in zip(slots.tolist(), (stops - sizes).tolist(), stops.tolist(), strict=True):
                queued[slot] += block[start:stop]
        floats = rng.standard_normal(int(rng.integers(1, 20))).astype("<f4").tobytes()
        inbox.write(3, floats)
        queued[3] += floats
        fed = np.flatnonzero(rng.random(4) < 0.6)
        limits = np.where(fed == 3, 4, 2) * rng.integers(1, 40, fed.size)
        staged = inbox.take(fed, limits)
        got = {} if staged is None else _taken(staged)
        for slot, limit in zip(fed.tolist(), limits.tolist(), strict=True):
            expected, queued[slot] = queued[slot][:limit], queued[slot][limit:]
            assert got.get(slot, b"") == expected
            handed += len(expected)
        if staged is not None:
            assert (staged.offsets[staged.slots == 3] % 4 == 0).all() and (staged.offsets % 2 == 0).all()
        assert inbox.pending_bytes.tolist() == [len(queued[slot]) for slot in range(4)]
    assert handed > 1000 and sum(map(len, queued.values())) > 0  # bytes went through and bytes waited

    # a float32 record right after an int16 record left at an offset of 2 modulo 4: both wait, the float stays aligned
    inbox = AudioInbox(4, torch.device("cpu"))
    inbox.write_many(np.array([0, 1]), bytes(range(8)), np.array([0, 2]), np.array([2, 8]))
    floats = np.array([0.5, -0.25], dtype="<f4").tobytes()
    inbox.write(3, floats)  # at offset 8: right after the block, in the same run once slot 0's bytes are taken
    assert _taken(inbox.take(np.array([0]), np.array([2]))) == {0: bytes(range(2))}
    staged = inbox.take(np.array([1, 3]), np.array([100, 100]))
    assert _taken(staged) == {1: bytes(range(2, 8)), 3: floats}
    assert staged.offsets[staged.slots == 3] % 4 == 0
