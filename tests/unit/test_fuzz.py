"""Fuzzing every boundary a peer can write to (issue 12), with hypothesis: whatever arrives is either
accepted as something the system can use or refused with the boundary's own error; nothing else
escapes, and nothing accepted can poison the learner. Bounded in examples so that `make test` stays
quick; the seed is printed on a failure so that it replays."""

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bandit_svc.state import BanditState, UnknownEpisode
from lbc import codec
from lbc.config import load_config
from lbc.params import all_finite, check_blob, shapes, to_blob
from lbc.sequences import sequence_layout, validate_sequence
from lbcproto import lbc_pb2
from learner_svc.training import Trainer
from replay_svc.__main__ import check_priorities

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CFG = load_config("catch")
DTYPES = sorted(codec.ALLOWED_DTYPES) + ["object", "float16", "", "<U4"]

dims = st.one_of(st.integers(0, 6), st.integers(-3, 2**63 - 1), st.sampled_from([2**32, 2**31, 2**62]))
array_specs = st.lists(st.tuples(st.text(max_size=12), st.sampled_from(DTYPES), st.lists(dims, max_size=10),
                                 st.binary(max_size=64)), max_size=5)


@FUZZ
@given(kind=st.text(max_size=10), specs=array_specs, version=st.integers(0, 2**32 - 1),
       extra_frames=st.integers(-1, 1))
# found by this test: zero bytes, yet dimensions whose product overflows numpy's index type
@example(kind="", specs=[("", "bool", [0, 2**31, 2**32], b"")], version=1, extra_frames=0)
def test_decode_accepts_only_what_its_header_describes(kind, specs, version, extra_frames):
    header = lbc_pb2.FrameHeader(schema_version=version % 3, kind=kind)
    for name, dtype, shape, _ in specs:
        header.arrays.add(name=name, dtype=dtype, shape=shape)
    frames = [header.SerializeToString(), *[data for *_, data in specs]]
    frames = frames[:len(frames) + extra_frames] if extra_frames < 0 else frames + [b""] * extra_frames
    try:
        msg = codec.decode(frames, max_bytes=10_000)
    except codec.CodecError as exc:
        assert exc.reason in codec.REASONS
        return
    for (_name, dtype, shape, data), arr in zip(specs, msg.arrays.values(), strict=True):
        assert arr.dtype == np.dtype(dtype) and list(arr.shape) == shape and arr.nbytes == len(data)


def _valid_sequence(rng: np.random.Generator) -> dict[str, np.ndarray]:
    seq = {name: np.zeros(shape, dtype) for name, (dtype, shape) in sequence_layout(CFG).items()}
    seq["obs"][:] = rng.integers(0, 256, seq["obs"].shape)
    seq["behaviour_prob"][:] = 1 / 3
    seq["psi"][:, :CFG.num_components] = 1.0
    seq["psi"][:, CFG.num_components:] = 1.0 / CFG.num_components
    return seq


FIELDS = ["reward", "prev_reward", "h0", "c0", "psi", "behaviour_prob", "action", "prev_action", "bootstrap"]
values = st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=32), st.integers(-2**31, 2**31 - 1),
                   st.sampled_from([3e38, 1e20, -1e20, 1e6, 1.0, -1.0, 0.0, 99.0]))


@pytest.fixture(scope="module")
def trainer():
    return Trainer(load_config("catch", ["learner.warmup_steps=0"]))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(poison=st.lists(st.tuples(st.sampled_from(FIELDS), st.integers(0, 10**6), values), min_size=1, max_size=2),
       seed=st.integers(0, 2**16))
def test_whatever_validation_accepts_trains_to_a_finite_loss(trainer, poison, seed):
    """The property issue 12 asks for: a sequence either fails validation or is harmless to the learner:
    its loss is finite and bounded (a reward of 1e20 gave a finite loss of 4e33; the largest reward
    accepted, env.max_abs_reward = 1e6, stays far below the bound through any reward shaping)."""
    seq = _valid_sequence(np.random.default_rng(seed))
    for name, index, value in poison:
        arr = seq[name]
        if arr.dtype.kind == "i":
            if not (math.isfinite(value) and -2**31 <= value < 2**31):
                continue
            value = int(value)
        arr.flat[index % arr.size] = value
    try:
        validate_sequence(seq, CFG)
    except codec.CodecError as exc:
        assert exc.reason in codec.REASONS
        return
    batch = {name: np.stack([arr] * CFG.learner.batch_size) for name, arr in seq.items()}
    batch["weight"] = np.ones(CFG.learner.batch_size, np.float32)
    total, _, priorities = trainer._loss(batch)
    assert abs(float(total.detach())) < 1e12 and np.all(np.isfinite(priorities.numpy()))


@FUZZ
@given(keys=st.lists(st.integers(-2**63, 2**63 - 1), max_size=8),
       priorities=st.lists(st.floats(width=32), max_size=8), names=st.sampled_from([("key", "priority"), ("key",),
                                                                                   ("key", "priority", "x")]))
def test_priority_updates_are_checked(keys, priorities, names):
    arrays = {"key": np.array(keys, np.int64), "priority": np.array(priorities, np.float32),
              "x": np.zeros(1, np.uint8)}
    try:
        k, p = check_priorities({n: arrays[n] for n in names}, capacity=16)
    except codec.CodecError as exc:
        assert exc.reason == "request"
        return
    assert len(k) == len(p) <= 16 and np.all(np.isfinite(p)) and np.all(p >= 0)


@FUZZ
@given(blob=st.one_of(st.binary(max_size=256), st.just(b"")), cut=st.integers(0, 10_000))
def test_parameter_blobs_parse_or_are_refused(blob, cut):
    from lbc.envs import env_spec
    from lbc.nets import build_net

    spec = env_spec(CFG.env)
    net = build_net(CFG, spec.obs_shape, spec.num_actions)
    good = to_blob(net)
    for candidate in (blob, good[:cut], good[:cut] + blob + good[cut + len(blob):]):
        try:
            state = check_blob(candidate, shapes(net))
        except ValueError:
            continue
        assert all(bool(np.isfinite(t.numpy()).all()) for t in state.values() if t.is_floating_point())


@FUZZ
@given(values=st.lists(st.floats(width=32), max_size=64), rows=st.integers(1, 4),
       dtype=st.sampled_from([torch.float16, torch.bfloat16, torch.float32, torch.float64]))
def test_a_blobs_finiteness_test_agrees_with_torchs(values, rows, dtype):
    """lbc.params.all_finite (numpy's test where numpy holds the dtype) against torch.isfinite, on values with NaN and
    infinities among them, in every float dtype (float16 and bfloat16 turn large float32 values into infinities)."""
    tensor = torch.tensor(values * rows, dtype=torch.float32).reshape(rows, -1).to(dtype)
    assert all_finite(tensor) == bool(torch.isfinite(tensor).all())
    assert all_finite(tensor.t()) == bool(torch.isfinite(tensor).all())


@FUZZ
@given(calls=st.lists(st.tuples(st.sampled_from(["select", "report"]), st.text(min_size=1, max_size=6),
                                st.text(max_size=20), st.floats(allow_nan=False, width=64)), max_size=40))
def test_the_bandit_state_stays_bounded_and_only_learns_from_its_own_episodes(calls):
    state = BanditState(load_config("cpu", ["bandit.max_actors=4"]))
    issued: dict[str, str] = {}
    for op, actor, episode, value in calls:
        if op == "select":
            issued[actor], _ = state.select(actor)
            continue
        own = issued.get(actor) if episode == "" else episode
        try:
            state.report(actor, own or episode, value)
        except UnknownEpisode:
            continue
        assert own == issued.get(actor)   # only an id the bandit handed out is accepted
        issued.pop(actor)
    assert len(state.controllers) == len(state.pending) == len(state.next_episode) <= 4
