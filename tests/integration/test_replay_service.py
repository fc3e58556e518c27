"""replay_svc as a real process: bad messages are rejected and counted while it keeps serving,
batches come back with the right layout, and the replay ratio is held."""

import threading
import time

import numpy as np
import pytest
import zmq

from lbc import codec
from lbc.config import load_config
from lbc.launch import scrape
from lbc.sequences import batch_layout, sequence_layout
from lbcproto import lbc_pb2
from learner_svc.batches import BatchFetcher
from tests.support import Service, endpoint_overrides, metric, overrides_dict, wait_for, wait_healthy


def _sequence(cfg, rng):
    seq = {}
    for name, (dtype, shape) in sequence_layout(cfg).items():
        seq[name] = rng.integers(0, 2, shape).astype(dtype) if dtype != "float32" else rng.random(shape, np.float32)
    seq["behaviour_prob"] = np.full_like(seq["behaviour_prob"], 0.5)
    seq["truncated"] &= seq["done"]   # a cut is an episode end
    k = cfg.num_components
    seq["psi"][:, k:] = 1.0 / k
    return seq


BASE = ["replay.min_sequences=32", "replay.replay_ratio=2.0", "replay.ratio_tolerance=40", "learner.batch_size=8"]


@pytest.fixture()
def start_replay(tmp_path):
    """Starts a replay_svc process on fresh ports (healthy, with a PUSH socket into it); whatever the
    test's outcome, the process is gone afterwards."""
    started = []

    def start(extra):
        overrides = endpoint_overrides(tmp_path / "run") + BASE + extra
        o = overrides_dict(overrides)
        svc = Service("replay_svc", "catch", overrides, tmp_path).start()
        started.append(svc)
        wait_healthy(o["endpoints.replay_health"])
        push = zmq.Context.instance().socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 0)
        push.connect(o["endpoints.replay_ingest"])
        return load_config("catch", overrides), o, svc, int(o["endpoints.replay_metrics"]), push

    yield start
    for svc in started:
        svc.kill()


def test_rejects_bad_messages_serves_batches_and_holds_ratio(start_replay):
    cfg, o, svc, port, push = start_replay(["replay.max_message_bytes=200000"])
    ctx = zmq.Context.instance()
    rng = np.random.default_rng(0)
    good = _sequence(cfg, rng)
    push.send_multipart([b"\x01\x02garbage", b"x"])                                       # malformed header
    frames = codec.encode("sequence", good)
    header = lbc_pb2.FrameHeader()
    header.ParseFromString(frames[0])
    header.schema_version = 99
    push.send_multipart([header.SerializeToString(), *frames[1:]])                       # wrong version
    push.send_multipart(codec.encode("sequence", {**good, "obs": good["obs"][:-1]}))    # wrong shape
    overflow = lbc_pb2.FrameHeader(schema_version=codec.SCHEMA_VERSION, kind="sequence")
    overflow.arrays.add(name="obs", dtype="uint8", shape=[2**32, 2**32])                # 2**64 elements
    for _ in range(7):                                  # seven of these used to stop the whole system
        push.send_multipart([overflow.SerializeToString(), b""])
    for name, value in [("h0", 3e38), ("prev_action", 99), ("reward", 1e20)]:          # finite but absurd
        poisoned = _sequence(cfg, rng)
        poisoned[name] = np.full_like(poisoned[name], value)
        push.send_multipart(codec.encode("sequence", poisoned))
    for i in range(50):                                 # distinct names must not grow the label set
        push.send_multipart(codec.encode("sequence", {**good, f"evil_{i}": np.zeros(1, np.uint8)}))
    push.send_multipart(codec.encode("sequence", {"x": np.zeros(300_000, np.uint8)}))   # oversized
    for _ in range(100):
        push.send_multipart(codec.encode("sequence", _sequence(cfg, rng), param_version=7))

    def inserted_while_sending() -> bool:
        # the oversized message may reset the connection (MAXMSGSIZE) with good ones still in flight, which
        # are lost then; the PUSH socket reconnects, so what is sent next must arrive
        for _ in range(8):
            try:
                push.send_multipart(codec.encode("sequence", _sequence(cfg, rng), param_version=7), zmq.NOBLOCK)
            except zmq.Again:
                break
        return metric(port, "lbc_replay_inserted_total") >= 32

    wait_for(inserted_while_sending, 20, "inserts")
    assert svc.alive()
    rejected = sum(v for _, v in scrape(port).get("lbc_replay_rejected_total", []))
    # the oversized one is dropped by ZeroMQ's MAXMSGSIZE (the connection is reset) or by the codec
    assert rejected >= 2 + 7 + 3 + 50
    reasons = {labels["reason"] for labels, _ in scrape(port)["lbc_replay_rejected_total"]}
    assert reasons <= set(codec.REASONS) and {"header", "layout", "frames", "value"} <= reasons
    log = svc.log()   # one line per reason a minute: the first of each kind
    assert "header does not parse" in log and "shape" in log and "h0 outside" in log
    assert log.count("rejected a message") <= len(codec.REASONS)

    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(o["endpoints.replay_serve"])
    request = codec.encode("batch_request", {}, meta={"batch_size": "8"})
    batches = 0
    for _ in range(200):
        dealer.send_multipart(request)
        if not dealer.poll(1500):
            break
        msg = codec.decode(dealer.recv_multipart(), max_bytes=10**8, expected_kind="batch")
        codec.check_layout(msg.arrays, batch_layout(cfg), leading=(8,))
        assert (msg.arrays["param_version"] == 7).all()
        batches += 1
    inserted = metric(port, "lbc_replay_inserted_total")
    sampled = metric(port, "lbc_replay_sampled_total")
    # the limiter stops serving once the learner is ahead: sampled <= 2 * (inserted - min) + tolerance
    assert batches > 0 and sampled == 8 * batches
    assert sampled <= 2.0 * (inserted - 32) + 40
    assert sampled >= 2.0 * (inserted - 32) - 40 - 8
    push.close()
    dealer.close()
    assert svc.stop() == 0, svc.log()


def test_prioritised_replay_follows_the_learners_priorities(start_replay):
    cfg, o, svc, port, push = start_replay(["replay.prioritised=true", "replay.priority_exponent=1.0",
                                            "replay.importance_exponent=1.0"])
    ctx = zmq.Context.instance()
    rng = np.random.default_rng(0)
    for version in range(48):   # all fit before the limiter asks for samples (2 x (48 - 32) <= 40)
        push.send_multipart(codec.encode("sequence", _sequence(cfg, rng), param_version=version))
    wait_for(lambda: metric(port, "lbc_replay_inserted_total") >= 48, 20, "inserts")

    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(o["endpoints.replay_serve"])

    def batch():
        dealer.send_multipart(codec.encode("batch_request", {}, meta={"batch_size": "8"}))
        assert dealer.poll(5000), "no batch"
        return codec.decode(dealer.recv_multipart(), max_bytes=10**8, expected_kind="batch").arrays

    first = batch()
    assert (first["weight"] == 1.0).all()        # every new sequence enters at the same (max) priority
    keys = np.array(sorted({int(k) for k in first["key"]}), np.int64)
    # sequence keys count up in insertion order from the first one's: make the one with version 5 dominate
    # (p 1000 vs 0.01)
    first_key = int(first["key"][0]) - int(first["param_version"][0])
    all_keys = first_key + np.arange(48, dtype=np.int64)
    priorities = np.where(all_keys == first_key + 5, 1000.0, 0.01).astype(np.float32)
    dealer.send_multipart(codec.encode("priorities", {"key": all_keys, "priority": priorities}))
    dealer.send_multipart(codec.encode("priorities", {"key": keys, "priority": -np.ones(len(keys), np.float32)}))
    wait_for(lambda: metric(port, "lbc_replay_priority_updates_total") >= 48, 10, "priority updates")
    versions = []
    for _ in range(4):
        arrays = batch()
        versions += arrays["param_version"].tolist()
        w, v = arrays["weight"], arrays["param_version"]
        # weights are normalised by the batch's largest; the likeliest sequence has the smallest
        assert w.max() == 1.0 and (w[v == 5] == w.min()).all()
    # P(version 5) = 1000 / (1000 + 47 * 0.01) = 0.9995
    assert versions.count(5) >= 30
    assert metric(port, "lbc_replay_priority_updates_total") == 48   # the negative update was rejected
    assert "priorities" in svc.log()
    push.close()
    dealer.close()
    assert svc.stop() == 0, svc.log()


def test_a_restarted_replay_serves_from_its_snapshot(start_replay):
    """Stopped and started again, replay serves the learner from what it stored, before any actor
    sends anything; the limiter goes on from its counts."""
    settings = ["replay.snapshot_every_s=3600"]   # written at the clean stop
    cfg, o, svc, port, push = start_replay(settings)
    rng = np.random.default_rng(0)
    for version in range(40):
        push.send_multipart(codec.encode("sequence", _sequence(cfg, rng), param_version=version))
    wait_for(lambda: metric(port, "lbc_replay_inserted_total") >= 40, 20, "inserts")

    def batch(o):
        dealer = zmq.Context.instance().socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(o["endpoints.replay_serve"])
        dealer.send_multipart(codec.encode("batch_request", {}, meta={"batch_size": "8"}))
        assert dealer.poll(5000), "no batch"
        arrays = codec.decode(dealer.recv_multipart(), max_bytes=10**8, expected_kind="batch").arrays
        dealer.close()
        return arrays

    before = batch(o)
    push.close()
    assert svc.stop() == 0, svc.log()
    assert "snapshot of 40 sequences" in svc.log()

    cfg, o, svc, port, push = start_replay(settings)
    assert metric(port, "lbc_replay_sequences") == 40 and "restored 40 sequences" in svc.log()
    after = batch(o)   # from the restored buffer, before any actor sends anything
    assert set(after["param_version"].tolist()) <= set(range(40))
    # the restored sequences have new keys, above every key of the first run: a key the learner keeps
    # (priority updates, target outputs) never names another sequence
    assert after["key"].min() > before["key"].max() + 40
    push.close()
    assert svc.stop() == 0, svc.log()


def test_a_message_of_many_large_frames_is_cut_off_by_zeromq(start_replay):
    """ZeroMQ bounds frames, not messages: replay bounds each frame by the largest array a sequence has,
    so a message of 34 frames of 1 MB is dropped by the socket before it is held whole."""
    from replay_svc.__main__ import largest_frame_bytes

    cfg, o, svc, port, push = start_replay([])
    assert largest_frame_bytes(cfg) < (1 << 20)
    header = lbc_pb2.FrameHeader(schema_version=codec.SCHEMA_VERSION, kind="sequence")
    push.send_multipart([header.SerializeToString(), *[bytes(1 << 20)] * 34])
    rng = np.random.default_rng(0)
    for _ in range(40):
        push.send_multipart(codec.encode("sequence", _sequence(cfg, rng)))
    wait_for(lambda: metric(port, "lbc_replay_inserted_total") >= 32, 20, "inserts after the big message")
    assert svc.alive()
    # had it been delivered, the codec would have refused it (34 frames, none in the header) and counted it
    assert not scrape(port).get("lbc_replay_rejected_total"), scrape(port).get("lbc_replay_rejected_total")
    push.close()
    assert svc.stop() == 0, svc.log()


def test_replay_keeps_one_request_per_slot_and_names_the_slot_it_answers(start_replay):
    """A learner's requests in flight are told apart by their slot: each is answered once, with its slot
    named; a request sent again on a slot replaces the first; a slot out of range is rejected."""
    cfg, o, svc, port, push = start_replay([])
    rng = np.random.default_rng(0)
    for _ in range(20):   # below replay.min_sequences (32): requests wait
        push.send_multipart(codec.encode("sequence", _sequence(cfg, rng)))
    wait_for(lambda: metric(port, "lbc_replay_inserted_total") >= 20, 20, "inserts")
    dealer = zmq.Context.instance().socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(o["endpoints.replay_serve"])
    for slot in ("0", "1", "1", "99"):
        dealer.send_multipart(codec.encode("batch_request", {}, meta={"batch_size": "8", "slot": slot}))
    wait_for(lambda: metric(port, "lbc_replay_rejected_total", reason="request") == 1, 10, "slot 99 rejected")
    assert metric(port, "lbc_replay_pending_requests") == 2
    assert not dealer.poll(300)
    for _ in range(20):
        push.send_multipart(codec.encode("sequence", _sequence(cfg, rng)))
    answered = []
    while dealer.poll(1500):
        answered.append(codec.decode(dealer.recv_multipart(), max_bytes=10**8, expected_kind="batch").meta["slot"])
    assert sorted(answered) == ["0", "1"]
    assert metric(port, "lbc_replay_pending_requests") == 0
    push.close()
    dealer.close()
    assert svc.stop() == 0, svc.log()


@pytest.mark.parametrize("in_flight", [1, 2])
def test_the_learners_fetcher_keeps_its_requests_in_flight_and_no_more_than_prefetch_batches_ahead(
        start_replay, in_flight):
    """learner_svc.batches.BatchFetcher against a real replay: it keeps learner.requests_in_flight requests
    waiting there, and batches fetched and asked for stay within learner.prefetch + 1."""
    cfg, o, svc, port, push = start_replay([f"learner.requests_in_flight={in_flight}", "learner.prefetch=2"])
    rng = np.random.default_rng(0)
    for _ in range(20):
        push.send_multipart(codec.encode("sequence", _sequence(cfg, rng)))
    wait_for(lambda: metric(port, "lbc_replay_inserted_total") >= 20, 20, "inserts")
    stop = threading.Event()
    fetcher = BatchFetcher(cfg, stop)
    fetcher.start()
    try:
        wait_for(lambda: metric(port, "lbc_replay_pending_requests") == in_flight, 10, "requests in flight")
        for _ in range(20):   # 40 stored: the limiter allows 2 x 8 + 40 samples, more than the fetcher takes
            push.send_multipart(codec.encode("sequence", _sequence(cfg, rng)))
        wait_for(lambda: metric(port, "lbc_replay_batches_total") >= 3, 20, "batches")
        time.sleep(1.0)
        # two in the queue, one held by the fetcher until there is room: prefetch + 1, nothing asked for
        assert metric(port, "lbc_replay_batches_total") == 3
        assert metric(port, "lbc_replay_pending_requests") == 0
        assert fetcher.get(1.0) is not None   # room: the held one goes in, one more is asked for
        wait_for(lambda: metric(port, "lbc_replay_batches_total") == 4, 10, "the next batch")
    finally:
        stop.set()
        fetcher.thread.join(5)
    push.close()
    assert svc.stop() == 0, svc.log()
