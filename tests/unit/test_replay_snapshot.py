"""Replay's snapshot: what goes in comes back (sequences, order, versions, priorities, the limiter's
counts); a damaged or foreign file loses only what does not validate."""

import logging

import numpy as np
import pytest

from lbc.config import load_config
from replay_svc import snapshot
from replay_svc.buffer import PrioritisedSequenceBuffer, RateLimiter, SequenceBuffer
from tests.integration.test_replay_service import _sequence

CFG = load_config("catch")
LOG = logging.getLogger("test")


def _filled(n: int, prioritised: bool = False) -> tuple[SequenceBuffer, RateLimiter]:
    buffer = PrioritisedSequenceBuffer(100, 10**9, 0.9, 0.6) if prioritised else SequenceBuffer(100, 10**9)
    limiter = RateLimiter(2.0, 4, 64.0)
    rng = np.random.default_rng(0)
    for version in range(n):
        buffer.add(_sequence(CFG, rng), version)
        limiter.insert()
    limiter.sample(8)
    return buffer, limiter


def _empty(prioritised: bool = False) -> tuple[SequenceBuffer, RateLimiter]:
    buffer = PrioritisedSequenceBuffer(100, 10**9, 0.9, 0.6) if prioritised else SequenceBuffer(100, 10**9)
    return buffer, RateLimiter(2.0, 4, 64.0)


@pytest.mark.parametrize("prioritised", [False, True])
def test_round_trip(tmp_path, prioritised):
    buffer, limiter = _filled(12, prioritised)
    if prioritised:
        buffer.update_priorities(np.arange(12, dtype=np.int64), np.linspace(0.5, 6.0, 12).astype(np.float32))
    snapshot.save(tmp_path / "s.bin", buffer, limiter)
    back, back_limiter = _empty(prioritised)
    assert snapshot.load(tmp_path / "s.bin", CFG, back, back_limiter, LOG) == 12
    assert (back_limiter.inserted, back_limiter.sampled) == (12, 8)
    for old, new in zip(buffer.items(), back.items(), strict=True):
        assert new.param_version == old.param_version and new.priority == old.priority
        assert old.arrays.keys() == new.arrays.keys()
        for name in old.arrays:
            np.testing.assert_array_equal(new.arrays[name], old.arrays[name])
    if prioritised:
        np.testing.assert_allclose(back.probabilities(), buffer.probabilities())
    assert not list(tmp_path.glob("*.tmp"))


def test_a_cut_file_keeps_what_came_before_the_cut(tmp_path):
    buffer, limiter = _filled(10)
    path = tmp_path / "s.bin"
    snapshot.save(path, buffer, limiter)
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * 0.55)])
    back, back_limiter = _empty()
    restored = snapshot.load(path, CFG, back, back_limiter, LOG)
    assert 4 <= restored < 10
    assert [it.param_version for it in back.items()] == list(range(restored))
    assert back_limiter.inserted == 10 - (10 - restored)


def test_sequences_that_do_not_validate_are_dropped(tmp_path):
    buffer, limiter = _filled(6)
    buffer.items()[2].arrays["h0"] = np.full_like(buffer.items()[2].arrays["h0"], 5.0)   # outside [-1, 1]
    path = tmp_path / "s.bin"
    snapshot.save(path, buffer, limiter)
    back, back_limiter = _empty()
    assert snapshot.load(path, CFG, back, back_limiter, LOG) == 5
    assert [it.param_version for it in back.items()] == [0, 1, 3, 4, 5]
    # another layout (a larger LSTM): nothing passes, nothing breaks
    other = load_config("catch", ["net.lstm=32"])
    assert snapshot.load(path, other, *_empty(), LOG) == 0


@pytest.mark.parametrize("content", [b"", b"LBCREPLAY1\n", b"LBCREPLAY1\n{not json\n", b"PK\x03\x04 a zip file",
                                     b"LBCREPLAY1\n" + b'{"inserted": 1, "sampled": 0, "sequences": 3}\n'
                                     + b"\xff\xff\xff\xff" + b"\x00" * 64])
def test_files_that_are_not_snapshots_restore_nothing(tmp_path, content):
    path = tmp_path / "s.bin"
    path.write_bytes(content)
    buffer, limiter = _empty()
    assert snapshot.load(path, CFG, buffer, limiter, LOG) == 0 and len(buffer) == 0
    assert snapshot.load(tmp_path / "missing.bin", CFG, buffer, limiter, LOG) == 0
