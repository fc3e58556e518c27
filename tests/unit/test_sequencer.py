import numpy as np
import pytest

from actor_svc.sequencer import SequenceBuilder
from lbc.sequences import sequence_fields


def test_sequences_overlap_by_burn_in_and_carry_the_state():
    burn, length, envs, lstm = 2, 3, 2, 4
    builder = SequenceBuilder(envs, burn, sequence_fields(burn + length, (1,), lstm, 2))
    out = []
    for t in range(12):
        obs = np.full((envs, 1), t, np.uint8)
        h = np.full((envs, lstm), float(t), np.float32)
        out += builder.observe(obs, np.full(envs, t), np.zeros(envs), np.zeros(envs, bool), h, -h, version=t // 4)
        builder.act(np.full(envs, t), np.full(envs, 0.5), np.zeros(envs, bool), np.full(envs, 0.25),
                    np.zeros((envs, 2)))
    # sequences of L = 5 steps, 6 observations, starting every `length` = 3 steps
    starts = [int(seq["obs"][0, 0]) for seq, _ in out[::envs]]
    assert starts == [0, 3, 6]
    seq, version = out[2]   # second sequence, env 0
    np.testing.assert_array_equal(seq["obs"][:, 0], np.arange(3, 9))
    np.testing.assert_array_equal(seq["action"], np.arange(3, 8))
    np.testing.assert_array_equal(seq["h0"], np.full(lstm, 3.0))
    np.testing.assert_array_equal(seq["c0"], np.full(lstm, -3.0))
    assert version == 0   # the oldest parameter version in the sequence (obs 3..8 span versions 0..2)
    # the burn-in steps of a sequence are the last learning steps of the previous one
    first = out[0][0]
    np.testing.assert_array_equal(seq["obs"][: burn + 1], first["obs"][-(burn + 1):])


def test_extra_observation_fields_travel_and_overlap_like_the_observations():
    """NGU's j and intrinsic reward are recorded per observation and shifted with them."""
    burn, length, envs = 1, 2, 2
    builder = SequenceBuilder(envs, burn, sequence_fields(burn + length, (1,), 2, 2,
                                                     {"mixture": "int32", "prev_intrinsic": "float32"}))
    out = []
    for t in range(7):
        extras = {"mixture": np.array([3, 5], np.int32), "prev_intrinsic": np.full(envs, t / 10, np.float32)}
        out += builder.observe(np.full((envs, 1), t, np.uint8), np.zeros(envs), np.zeros(envs), np.zeros(envs, bool),
                               np.zeros((envs, 2)), np.zeros((envs, 2)), 0, extras)
        builder.act(np.zeros(envs), np.zeros(envs), np.zeros(envs, bool), np.ones(envs), np.zeros((envs, 2)))
    first, second = out[0][0], out[2][0]
    np.testing.assert_array_equal(first["mixture"], [3, 3, 3, 3])
    np.testing.assert_array_equal(out[1][0]["mixture"], [5, 5, 5, 5])
    np.testing.assert_allclose(first["prev_intrinsic"], [0.0, 0.1, 0.2, 0.3])
    np.testing.assert_allclose(second["prev_intrinsic"], [0.2, 0.3, 0.4, 0.5])
    with pytest.raises(ValueError, match="extra fields"):
        builder.observe(np.zeros((envs, 1), np.uint8), np.zeros(envs), np.zeros(envs), np.zeros(envs, bool),
                        np.zeros((envs, 2)), np.zeros((envs, 2)), 0)


def test_the_layout_drives_the_builder():
    """Whatever the layout holds (here NGU's extra fields and a 2x3 observation), the builder's sequences
    have exactly its fields, dtypes and shapes; a layout that is not a sequence's is refused."""
    from lbc.codec import check_layout

    layout = sequence_fields(4, (2, 3), 5, 6, {"mixture": "int32", "prev_intrinsic": "float32"})
    builder = SequenceBuilder(2, 1, layout)
    out = []
    for t in range(9):
        extras = {"mixture": np.array([1, 2], np.int32), "prev_intrinsic": np.zeros(2, np.float32)}
        out += builder.observe(np.full((2, 2, 3), t, np.uint8), np.zeros(2), np.zeros(2), np.zeros(2, bool),
                               np.zeros((2, 5)), np.zeros((2, 5)), 0, extras)
        builder.act(np.zeros(2), np.zeros(2), np.zeros(2, bool), np.ones(2), np.zeros((2, 6)))
    assert len(out) == 4
    for seq, _ in out:
        check_layout(seq, layout)
    with pytest.raises(ValueError, match="not a sequence layout"):
        SequenceBuilder(2, 1, {k: v for k, v in layout.items() if k != "psi"})
