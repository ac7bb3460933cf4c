"""``transcription.delay`` as the encoder's look-ahead (nemo_fastdecode/serve/look_aheads.py): the five delay names
spread over the offered look-aheads, an engine per look-ahead, each session's items NeMo's cache-aware streaming at
the look-ahead its delay picks (real server on 127.0.0.1, the shipped trained model), a full engine refused by name."""

from __future__ import annotations

import asyncio
import contextlib
import json

import numpy as np
import pytest
from test_serve import (  # noqa: F401 -- the fixtures examples and trained_model
    KEY,
    RATE,
    ServerThread,
    append,
    check_completed,
    examples,
    run,
    trained_model,
    words_of,
)

from nemo_fastdecode.apps.loadtest.client import COMPLETED, connect_session, receive_until
from nemo_fastdecode.apps.options import parse_config
from nemo_fastdecode.apps.streaming_reference import reference_transcript
from nemo_fastdecode.serve import ServeConfig, build_engines
from nemo_fastdecode.serve.look_aheads import LookAheads, delay_index
from nemo_fastdecode.serve.protocol import DELAYS
from nemo_fastdecode.streaming.transcriber import set_att_context_size

pytestmark = pytest.mark.usefixtures("single_thread")

SHORT, LONG = [70, 0], [70, 13]  # two of the trained model's look-aheads: [[70, 13], [70, 6], [70, 1], [70, 0]]


# ---- the mapping -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("offered", "expected"),
    [(1, [0, 0, 0, 0, 0]), (2, [0, 0, 1, 1, 1]), (3, [0, 1, 1, 2, 2]), (4, [0, 1, 2, 2, 3]), (5, [0, 1, 2, 3, 4])],
)
def test_the_delay_names_spread_over_the_look_aheads_shortest_first(offered, expected):
    assert [delay_index(i, offered) for i in range(len(DELAYS))] == expected


@pytest.mark.parametrize("offered", [6, 7, 12])
def test_with_more_look_aheads_than_names_minimal_and_xhigh_get_the_ends(offered):
    picked = [delay_index(i, offered) for i in range(len(DELAYS))]
    assert picked[0] == 0 and picked[-1] == offered - 1 and picked == sorted(set(picked))


def test_look_aheads_name_the_engines_and_the_default_serves_an_unset_delay():
    look = LookAheads.of([(70, 0), (70, 1), (70, 6), (70, 13)], [70, 13])
    assert look.default == 3 and look.engine_of(None) == 3
    assert [look.engine_of(name) for name in DELAYS] == [0, 1, 2, 2, 3]
    assert look.describe(2) == "look-ahead att_context_size=[70, 6] (delay medium, high)"
    assert LookAheads.of([(70, 0)], [70, 13]).default == 0  # not offered: the first
    with pytest.raises(ValueError, match="shortest look-ahead first"):
        LookAheads.of([(70, 13), (70, 0)])


def test_look_aheads_option_parses_and_is_checked():
    config = parse_config(ServeConfig, ["look_aheads=[[70,13],[70,0]]", "slots=2"], "t")
    assert [list(e.att_context_size) for e in config.engines] == [SHORT, LONG]  # shortest first
    assert all(e.num_slots == 2 for e in config.engines)  # slots per engine
    assert parse_config(ServeConfig, ["look_aheads=all"], "t").look_aheads == "all"
    assert ServeConfig().look_aheads is None and len(ServeConfig().engines) == 1  # by default: one engine
    for bad in ("some", [[70]], [], [[70, 1.5]]):
        with pytest.raises(ValueError, match="look_aheads must be null, 'all' or a non-empty list"):
            ServeConfig(look_aheads=bad)
    with pytest.raises(ValueError, match="look_aheads .* needs network_workers: 0"):
        ServeConfig(look_aheads="all", network_workers=2)


# ---- the server ----------------------------------------------------------------------------------------------------
def references_at(model, att: list[int], pcms: list[np.ndarray]) -> list:
    """NeMo's cache-aware streaming of each ``pcm`` alone at look-ahead ``att`` (the encoder's default restored)."""
    before = list(model.encoder.att_context_size)
    set_att_context_size(model.encoder, att)
    try:
        return [reference_transcript(model, pcm) for pcm in pcms]
    finally:
        set_att_context_size(model.encoder, before)


async def set_delay(ws, delay: str) -> dict:
    """``session.update`` with ``delay``; the reply (``session.updated``, or the refusal's ``error``)."""
    update = {"type": "session.update", "session": {"audio": {"input": {"transcription": {"delay": delay}}}}}
    await ws.send(json.dumps(update))
    return json.loads(await ws.recv())


def look_ahead_of(updated: dict) -> list[int]:
    assert updated["type"] == "session.updated", updated
    return updated["session"]["audio"]["input"]["transcription"]["att_context_size"]


async def send_audio(ws, pcm: np.ndarray, pieces: int = 6) -> None:
    for piece in np.array_split(pcm, pieces):
        await ws.send(append(piece))
        await asyncio.sleep(0.01)


async def minimal_and_xhigh_clients(url: str, first: np.ndarray, second: np.ndarray, third: np.ndarray):
    """Client A: ``minimal``, one item (``first``). Client B: ``xhigh``, an item (``second``) during which it asks for
    ``minimal`` (the item stays at ``xhigh``), then an item (``third``) at ``minimal``. Each client's session
    reports and completed events."""

    async def client_a():
        ws, created = await connect_session(url, KEY, rate=RATE)
        async with ws:
            reported = [look_ahead_of(await set_delay(ws, "minimal"))]
            await send_audio(ws, first)
            await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            events = await receive_until(ws, lambda e: e["type"] == COMPLETED, 120)
        return created, reported, events

    async def client_b():
        ws, _ = await connect_session(url, KEY, rate=RATE)
        async with ws:
            reported = [look_ahead_of(await set_delay(ws, "xhigh"))]
            half = len(second) // 2
            await send_audio(ws, second[:half], 3)
            reported.append(look_ahead_of(await set_delay(ws, "minimal")))  # mid-item: from the next item
            await send_audio(ws, second[half:], 3)
            await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            await send_audio(ws, third)
            await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            events = await receive_until(ws, lambda e: e["type"] == COMPLETED and e["item_id"].endswith("_1"), 120)
        return reported, events

    return await asyncio.gather(client_a(), client_b())


def test_each_delay_streams_exactly_at_its_own_look_ahead(trained_model, examples):  # noqa: F811
    """``look_aheads`` of two on the trained model: a ``minimal`` session's final is NeMo's streaming at [70, 0], an
    ``xhigh`` one's at [70, 13]; a delay changed mid-item applies from the next item (the item's audio all on its
    engine); an unset delay reports the encoder's default look-ahead."""
    first, second, third = (pcm for pcm, _ in examples[:3])
    short_refs = references_at(trained_model, SHORT, [first, third, second])
    long_refs = references_at(trained_model, LONG, [second])
    assert all(r.token_ids for r in [*short_refs, *long_refs])  # there is something to compare
    # the look-ahead shows in the words' timestamps: the item in flight is checked against the one it must have
    assert words_of(short_refs[2].words) != words_of(long_refs[0].words)
    s = ServerThread(trained_model, slots=2, model_name="trained-streaming", api_key=KEY, look_aheads=[LONG, SHORT])
    try:
        engines = s.server.engine_loop.engines
        assert [list(e.geometry.att_context_size) for e in engines] == [SHORT, LONG]  # two engines, two look-aheads
        assert [e.num_slots for e in engines] == [2, 2]
        (created, reported_a, events_a), (reported_b, events_b) = run(
            minimal_and_xhigh_clients(s.url, first, second, third), 240
        )
        assert created["session"]["audio"]["input"]["transcription"]["att_context_size"] == LONG  # the default
        assert reported_a == [SHORT] and reported_b == [LONG, SHORT]
        assert not [e for e in events_a + events_b if e["type"] == "error"]
        (final_a,) = [e for e in events_a if e["type"] == COMPLETED]
        check_completed(final_a, short_refs[0], first)
        finals_b = [e for e in events_b if e["type"] == COMPLETED]
        assert len(finals_b) == 2
        check_completed(finals_b[0], long_refs[0], second)  # the item in flight when the delay changed: xhigh
        check_completed(finals_b[1], short_refs[1], third)  # the next one: minimal
        assert s.settled()
    finally:
        s.stop()


def test_a_delay_whose_engine_is_full_is_refused_by_name_and_changes_nothing(trained_model):  # noqa: F811
    """One slot per engine: a new connection takes the default engine's ([70, 13]); another session asking for the
    delay of the engine another session holds gets ``server_at_capacity`` naming it, keeps its look-ahead, and gets it
    once that session leaves."""
    s = ServerThread(trained_model, slots=1, model_name="trained-streaming", api_key=KEY, look_aheads=[LONG, SHORT])

    async def scenario() -> None:
        a, _ = await connect_session(s.url, KEY, rate=RATE)
        assert look_ahead_of(await set_delay(a, "low")) == SHORT  # A moves to [70, 0], freeing [70, 13]
        b, _ = await connect_session(s.url, KEY, rate=RATE)
        refused = await set_delay(b, "minimal")
        assert refused["type"] == "error", refused
        error = refused["error"]
        assert error["code"] == "server_at_capacity" and error["param"] == "session.audio.input.transcription.delay"
        assert "att_context_size=[70, 0] (delay minimal, low)" in error["message"]
        assert look_ahead_of(await set_delay(b, "high")) == LONG  # B still has its engine
        c, refused_c = await connect_session(s.url, KEY)  # the default engine is full: refused at the door
        assert refused_c["type"] == "error" and refused_c["error"]["code"] == "server_at_capacity"
        with contextlib.suppress(Exception):
            await c.close()
        await a.close()
        for _ in range(100):  # A's slot frees once the server has seen it leave
            if s.server.admission.admitted == 1:
                break
            await asyncio.sleep(0.02)
        assert look_ahead_of(await set_delay(b, "minimal")) == SHORT
        await b.close()

    try:
        run(scenario(), 60)
        assert s.settled()
    finally:
        s.stop()


def test_look_aheads_all_builds_an_engine_per_trained_look_ahead(trained_model):  # noqa: F811
    """``look_aheads=all`` on the trained model: four engines, shortest look-ahead first, the encoder's default left
    at the unset delay's ([70, 13]); an ``att_context_size`` that is not offered is refused by name."""
    engines = build_engines(trained_model, ServeConfig(slots=1, look_aheads="all"))
    assert [list(e.geometry.att_context_size) for e in engines] == [[70, 0], [70, 1], [70, 6], LONG]
    assert list(trained_model.encoder.att_context_size) == LONG
    engines = build_engines(trained_model, ServeConfig(slots=1, look_aheads=[LONG, SHORT], att_context_size=SHORT))
    assert list(trained_model.encoder.att_context_size) == SHORT  # the unset delay's, which RealtimeServer reads
    set_att_context_size(trained_model.encoder, LONG)
    with pytest.raises(
        ValueError, match=r"att_context_size=\[70, 6\] is not one of look_aheads: \[\[70, 0\], \[70, 13\]\]"
    ):
        build_engines(trained_model, ServeConfig(slots=1, look_aheads=[LONG, SHORT], att_context_size=[70, 6]))
