"""The ZeroMQ codec: round trips, and clear rejections of bad messages."""

import threading

import numpy as np
import pytest
import zmq

from actor_svc.peers import SequenceSender, check_behaviour
from lbc import codec
from lbc.config import load_config
from lbc.presets import CATCH_SIZING, deep_merge
from lbc.sequences import (
    SEQUENCES_IN_SOCKET_BUFFERS,
    sequence_layout,
    socket_buffer_bytes,
    validate_batch,
    validate_sequence,
)
from lbcproto import lbc_pb2


def _arrays():
    return {"obs": np.arange(24, dtype=np.uint8).reshape(2, 3, 4), "r": np.array([1.5, -2.0], np.float32),
            "done": np.array([True, False]), "a": np.array([3, 1], np.int32)}


def test_round_trip_keeps_arrays_and_header():
    frames = codec.encode("sequence", _arrays(), sender="actor-0", param_version=42, meta={"k": "v"})
    msg = codec.decode(frames, max_bytes=10_000, expected_kind="sequence")
    assert (msg.kind, msg.sender, msg.param_version, msg.meta) == ("sequence", "actor-0", 42, {"k": "v"})
    for name, arr in _arrays().items():
        np.testing.assert_array_equal(msg.arrays[name], arr)
        assert msg.arrays[name].dtype == arr.dtype


def test_decode_is_zero_copy():
    frames = codec.encode("sequence", _arrays())
    msg = codec.decode(frames, max_bytes=10_000)
    assert not msg.arrays["obs"].flags.owndata


@pytest.mark.parametrize("mutate,reason", [
    (lambda f: [b"\xff\xfe garbage", *f[1:]], "header does not parse"),
    (lambda f: f[:-1], "frames follow"),
    (lambda f: [*f[:-1], b"\x00" * 3], "bytes for shape"),
    (lambda f: [], "empty message"),
])
def test_malformed_messages_are_rejected_with_a_reason(mutate, reason):
    frames = codec.encode("sequence", _arrays())
    with pytest.raises(codec.CodecError, match=reason):
        codec.decode(mutate(list(frames)), max_bytes=10_000)


def test_oversized_message_is_rejected():
    frames = codec.encode("sequence", {"x": np.zeros(5000, np.uint8)})
    with pytest.raises(codec.CodecError, match="exceeds the limit"):
        codec.decode(frames, max_bytes=1000)


def test_wrong_schema_version_is_rejected():
    frames = codec.encode("sequence", _arrays())
    header = lbc_pb2.FrameHeader()
    header.ParseFromString(frames[0])
    header.schema_version = codec.SCHEMA_VERSION + 1
    with pytest.raises(codec.CodecError, match="schema version"):
        codec.decode([header.SerializeToString(), *frames[1:]], max_bytes=10_000)


def test_disallowed_dtype_and_wrong_kind():
    with pytest.raises(codec.CodecError, match="dtype"):
        codec.encode("sequence", {"x": np.zeros(2, np.complex64)})
    # named int32 too, but its bytes would be read back in the other order: refused, not sent
    with pytest.raises(codec.CodecError, match="dtype"):
        codec.encode("sequence", {"x": np.arange(2, dtype=">i4")})
    frames = codec.encode("batch", _arrays())
    with pytest.raises(codec.CodecError, match="expected 'sequence'"):
        codec.decode(frames, max_bytes=10_000, expected_kind="sequence")


def test_object_arrays_cannot_be_smuggled():
    header = lbc_pb2.FrameHeader(schema_version=codec.SCHEMA_VERSION, kind="sequence")
    header.arrays.add(name="x", dtype="object", shape=[1])
    with pytest.raises(codec.CodecError, match="not allowed"):
        codec.decode([header.SerializeToString(), b"\x00" * 8], max_bytes=10_000)


def test_a_shape_whose_size_overflows_int64_is_refused_not_reshaped():
    # 2**32 x 2**32 elements: an int64 product wraps to 0, which an empty frame would match
    header = lbc_pb2.FrameHeader(schema_version=codec.SCHEMA_VERSION, kind="sequence")
    header.arrays.add(name="obs", dtype="uint8", shape=[2**32, 2**32])
    with pytest.raises(codec.CodecError, match="bytes for shape") as err:
        codec.decode([header.SerializeToString(), b""], max_bytes=10_000)
    assert err.value.reason == "frames"


def test_too_many_dimensions_and_bool_bytes_other_than_0_1_are_refused():
    header = lbc_pb2.FrameHeader(schema_version=codec.SCHEMA_VERSION, kind="sequence")
    header.arrays.add(name="x", dtype="uint8", shape=[1] * (codec.MAX_DIMS + 1))
    with pytest.raises(codec.CodecError, match="more than"):
        codec.decode([header.SerializeToString(), b"\x00"], max_bytes=10_000)
    frames = codec.encode("sequence", {"done": np.array([True, False])})
    with pytest.raises(codec.CodecError, match="bool bytes"):
        codec.decode([frames[0], b"\x01\x07"], max_bytes=10_000)


def test_rejection_reasons_form_a_fixed_set():
    with pytest.raises(ValueError, match="unknown rejection reason"):
        codec.CodecError("x", reason="anything a peer wrote")
    names = [f"array_{i}" for i in range(50)]   # distinct names must not make distinct reasons
    reasons = set()
    for name in names:
        try:
            codec.check_layout({name: np.zeros(1, np.uint8)}, {"obs": ("uint8", (1,))})
        except codec.CodecError as exc:
            reasons.add(exc.reason)
    assert reasons == {"layout"}


def _valid_sequence(cfg):
    seq = {name: np.ones(shape, dtype=np.dtype(dtype)) for name, (dtype, shape) in sequence_layout(cfg).items()}
    seq["behaviour_prob"][:] = 0.5
    k = cfg.num_components
    seq["psi"][:, k:] = 1.0 / k
    return seq


@pytest.mark.parametrize("preset", ["cpu", "catch"])
def test_the_sequence_sockets_hold_two_sequences_in_the_kernel(preset):
    """layout_bytes counts the bytes of a sequence message's array frames (encoded here), and the actors' and
    replay's sequence sockets get kernel buffers for two such sequences, 64 KiB at the least: Catch's 1.6 KB
    sequences get the floor, `cpu`'s Atari ones (33 frames of 84 x 84) twice their size."""
    cfg = load_config(preset)
    frames = codec.encode("sequence", _valid_sequence(cfg), sender="actor-0")
    sent = sum(len(memoryview(frame).cast("B")) for frame in frames[1:])   # the header frame aside
    assert codec.layout_bytes(sequence_layout(cfg)) == sent
    assert socket_buffer_bytes(cfg) == max(SEQUENCES_IN_SOCKET_BUFFERS * sent, 65536)
    assert (socket_buffer_bytes(cfg) == 65536) == (preset == "catch")
    sender = SequenceSender(cfg, "actor-0", threading.Event())   # connects lazily: no replay needed
    try:
        assert sender.sock.getsockopt(zmq.SNDBUF) == socket_buffer_bytes(cfg)
    finally:
        sender.close()


def _with(seq, name, value):
    arr = seq[name].copy()
    arr.flat[0] = value
    return dict(seq, **{name: arr})


@pytest.mark.parametrize("name, value, says", [
    ("prev_action", 99, "prev_action outside"),
    ("prev_action", -1, "prev_action outside"),
    ("h0", 3e38, "h0 outside"),
    ("c0", 3e38, "c0 not finite or beyond"),
    ("c0", np.nan, "c0 not finite"),
    ("reward", 1e20, "reward not finite or beyond env.max_abs_reward"),
    ("prev_reward", -1e20, "prev_reward not finite"),
    ("psi", 1e9, "tau outside"),
    ("psi", -0.5, "tau outside"),
    # cpu: max_i |RS_i(1e6)| / (1 - 0.99) = (sqrt(1e6 + 1) - 1 + 1e-3 * 1e6) / 0.01 = 1,999 / 0.01 (rs1)
    ("bootstrap", 1e7, "bootstrap not finite or beyond 199900,"),
    ("bootstrap", np.inf, "bootstrap not finite"),
    ("done", False, "truncated where the episode did not end"),   # every step is marked truncated here
])
def test_finite_but_absurd_values_are_refused(name, value, says):
    """Issue 12's poisoned sequences: each is finite, and each one would have broken the learner."""
    cfg = load_config("cpu")
    seq = _valid_sequence(cfg)
    validate_sequence(seq, cfg)
    with pytest.raises(codec.CodecError, match=says) as err:
        validate_sequence(_with(seq, name, value), cfg)
    assert err.value.reason == "value"


def test_psi_weights_must_be_a_distribution():
    cfg = load_config("cpu")
    seq = _valid_sequence(cfg)
    psi = seq["psi"].copy()
    psi[3, cfg.num_components:] = [0.9, 0.9, -0.8]
    with pytest.raises(codec.CodecError, match="omega"):
        validate_sequence(dict(seq, psi=psi), cfg)


def test_a_batch_is_validated_like_its_sequences():
    cfg = load_config("catch")
    seq = _valid_sequence(cfg)
    batch = {name: np.stack([seq[name]] * 2) for name in seq}
    batch |= {"param_version": np.zeros(2, np.int64), "key": np.arange(2), "weight": np.ones(2, np.float32)}
    validate_batch(batch, cfg, 2)
    bad = dict(batch, h0=np.full_like(batch["h0"], 5.0))
    with pytest.raises(codec.CodecError, match="h0"):
        validate_batch(bad, cfg, 2)
    with pytest.raises(codec.CodecError, match="weights"):
        validate_batch(dict(batch, weight=np.array([1.0, np.inf], np.float32)), cfg, 2)


def test_sequence_validation():
    cfg = load_config("catch")
    seq = _valid_sequence(cfg)
    validate_sequence(seq, cfg)
    bad = dict(seq, action=np.full_like(seq["action"], 7))
    with pytest.raises(codec.CodecError, match="action outside"):
        validate_sequence(bad, cfg)
    bad = dict(seq, behaviour_prob=np.zeros_like(seq["behaviour_prob"]))
    with pytest.raises(codec.CodecError, match="behaviour_prob"):
        validate_sequence(bad, cfg)
    bad = dict(seq, obs=seq["obs"][:-1])
    with pytest.raises(codec.CodecError, match="shape"):
        validate_sequence(bad, cfg)
    bad = dict(seq, reward=np.full_like(seq["reward"], np.nan))
    with pytest.raises(codec.CodecError, match="not finite"):
        validate_sequence(bad, cfg)
    extra = dict(seq, evil=np.zeros(1, np.uint8))
    with pytest.raises(codec.CodecError, match="unexpected"):
        validate_sequence(extra, cfg)


def test_ngu_sequences_carry_a_valid_mixture_and_intrinsic_reward():
    cfg = load_config("ngu", deep_merge(CATCH_SIZING, {"ngu": {"num_mixtures": 4}}))
    seq = _valid_sequence(cfg)
    validate_sequence(seq, cfg)
    with pytest.raises(codec.CodecError, match="mixture outside"):
        validate_sequence(dict(seq, mixture=np.full_like(seq["mixture"], 4)), cfg)
    with pytest.raises(codec.CodecError, match="prev_intrinsic"):
        validate_sequence(dict(seq, prev_intrinsic=np.full_like(seq["prev_intrinsic"], -1.0)), cfg)
    with pytest.raises(codec.CodecError, match="missing"):
        validate_sequence({k: v for k, v in seq.items() if k != "mixture"}, cfg)


def test_a_bandit_reply_is_checked_before_an_actor_uses_it():
    assert check_behaviour([1.0, 2.0], [0.5, 0.5], 2, 50.0) == ""
    assert "sum to 1" in check_behaviour([1.0, 2.0], [0.5, 0.6], 2, 50.0)
    assert "tau outside" in check_behaviour([-1.0, 2.0], [0.5, 0.5], 2, 50.0)
    assert "tau outside" in check_behaviour([51.0, 2.0], [0.5, 0.5], 2, 50.0)
    assert "finite" in check_behaviour([float("nan"), 2.0], [0.5, 0.5], 2, 50.0)
    assert "2 tau" in check_behaviour([1.0, 2.0], [1.0], 1, 50.0)
    assert check_behaviour([1.0], [1.0], 1, 50.0, mixture=3, num_mixtures=4) == ""
    assert "mixture" in check_behaviour([1.0], [1.0], 1, 50.0, mixture=4, num_mixtures=4)
    assert "mixture" in check_behaviour([1.0], [1.0], 1, 50.0, mixture=None, num_mixtures=4)


def test_meta_int_reads_an_integer_or_says_it_is_not_one():
    assert codec.meta_int({"slot": "3"}, "slot", 0) == 3
    assert codec.meta_int({}, "slot", 0) == 0                       # absent: the default
    assert codec.meta_int({"slot": "x1"}, "slot", 0) is None
    assert codec.meta_int({"batch_size": "9" * 40}, "batch_size", 0) == int("9" * 12)   # 12 characters at most
