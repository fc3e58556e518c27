"""security.enabled: only holders of the run's certificates and keys reach the services. A stranger
(no TLS, or a certificate from another CA, no CURVE key, or a CURVE key replay does not know) is refused
at the handshake; the run's own clients work; health-only ports stay plain for Kubernetes' probes."""

import subprocess
import sys

import grpc
import numpy as np
import pytest
import zmq
import zmq.auth

from lbc import codec
from lbc.config import load_config
from lbc.peers import BanditClient, ParameterClient
from lbc.security import channel_credentials, curve_client, make_certificates
from tests.integration.test_replay_service import _sequence
from tests.support import REPO, Service, endpoint_overrides, metric, overrides_dict, wait_for, wait_healthy


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    root = tmp_path_factory.mktemp("secured")
    certs, strangers = root / "certs", root / "strangers"
    make_certificates(certs)
    make_certificates(strangers)   # a whole other CA and other CURVE keys
    overrides = endpoint_overrides(root / "run") + ["security.enabled=true", f"security.certs_dir={certs}"]
    services = [Service(m, "catch", overrides, root).start() for m in ("replay_svc", "learner_svc", "bandit_svc")]
    o = overrides_dict(overrides)
    wait_healthy(o["endpoints.replay_health"])   # a health-only port: plain
    client = ParameterClient(o["endpoints.params"], "test", 2.0, channel_credentials(certs))
    wait_for(lambda: _answers(client), 60, "the learner over mutual TLS")
    yield {"o": o, "certs": certs, "strangers": strangers, "cfg": load_config("catch", overrides)}
    codes = [s.stop() for s in services]
    assert codes == [0, 0, 0], [s.log()[-2000:] for s in services]


def _answers(client: ParameterClient) -> bool:
    try:
        return client.pull(-1) is not None
    except grpc.RpcError:
        return False


def test_grpc_strangers_are_refused_and_the_run_gets_in(secured):
    o, certs, strangers = secured["o"], secured["certs"], secured["strangers"]
    for credentials in (None, channel_credentials(strangers)):
        with pytest.raises(grpc.RpcError) as refused:
            ParameterClient(o["endpoints.params"], "stranger", 2.0, credentials).pull(-1)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        with pytest.raises(grpc.RpcError):
            BanditClient(o["endpoints.bandit"], 2.0, credentials).select("actor-x")
    version, blob = ParameterClient(o["endpoints.params"], "actor", 2.0, channel_credentials(certs)).pull(-1)
    assert version >= 0 and len(blob) > 1000
    assert BanditClient(o["endpoints.bandit"], 2.0, channel_credentials(certs)).select("actor-0").episode_id


def _refusable_socket(kind: int, endpoint: str, configure=lambda sock: None) -> zmq.Socket:
    """A stranger's (or the run's) socket whose sends give up after 2 s. A refused CURVE handshake tears the
    connection down and ZeroMQ reconnects: caught between the two, a send blocks for want of a peer (one hung a
    run for 600 s)."""
    sock = zmq.Context.instance().socket(kind)
    sock.setsockopt(zmq.LINGER, 500)
    sock.setsockopt(zmq.SNDTIMEO, 2000)
    configure(sock)
    sock.connect(endpoint)
    return sock


def _send_or_refused(sock: zmq.Socket, frames: list) -> bool:
    """Sends; False when there was no peer to send to within the timeout, which is a refusal as well."""
    try:
        sock.send_multipart(frames)
        return True
    except zmq.Again:
        return False


def test_zeromq_strangers_are_refused_and_the_run_gets_in(secured):
    o, certs, strangers, cfg = secured["o"], secured["certs"], secured["strangers"], secured["cfg"]
    port = int(o["endpoints.replay_metrics"])
    rng = np.random.default_rng(0)

    def push(configure) -> None:
        sock = _refusable_socket(zmq.PUSH, o["endpoints.replay_ingest"], configure)
        for _ in range(5):
            if not _send_or_refused(sock, codec.encode("sequence", _sequence(cfg, rng))):
                break
        sock.close()

    push(lambda s: None)                                    # no CURVE at all
    push(lambda s: curve_client(s, strangers))             # CURVE, another run's keys

    def known_server_unknown_client(sock: zmq.Socket) -> None:   # replay's public key is no secret
        sock.curve_publickey, sock.curve_secretkey = zmq.auth.load_certificate(
            strangers / "curve" / "client.key_secret")
        sock.curve_serverkey = zmq.auth.load_certificate(certs / "curve" / "server.key")[0]

    push(known_server_unknown_client)
    dealer = _refusable_socket(zmq.DEALER, o["endpoints.replay_serve"])
    _send_or_refused(dealer, codec.encode("batch_request", {}, meta={"batch_size": "1"}))
    assert not dealer.poll(2000), "a stranger drew a batch"
    dealer.close()
    assert metric(port, "lbc_replay_inserted_total") == 0, "a stranger's sequences were stored"

    push(lambda s: curve_client(s, certs))                 # the run's own key
    wait_for(lambda: metric(port, "lbc_replay_inserted_total") >= 5, 20, "the run's sequences")


def test_a_service_without_the_certificates_says_how_to_make_them(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "replay_svc", "--preset", "catch", "--set", "security.enabled=true",
                           "--set", f"run_dir={tmp_path / 'run'}"], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode != 0
    assert f"lbc certs {tmp_path / 'run' / 'certs'}" in proc.stderr and "security.enabled=false" in proc.stderr


def test_inference_strangers_are_refused_and_the_run_gets_in(secured):
    """Central inference's socket takes CURVE like replay's: a request without the run's key gets no answer;
    an actor of the run gets one."""
    import threading

    import torch

    from actor_svc.remote import REQUEST, RemoteNetwork, request_arrays
    from lbc.acting import CoreInputs
    from lbc.envs import env_spec

    o, cfg = secured["o"], secured["cfg"]
    overrides = [f"{k}={v}" for k, v in o.items()] + ["actor.inference=remote"]
    inference = Service("actor_svc", "catch", overrides, secured["certs"].parent, "--mode", "infer").start()
    try:
        wait_healthy(o["endpoints.inference_health"], "lbc.v1.Inference", timeout=60)   # health: plain
        spec = env_spec(cfg.env)
        state_size = cfg.net.lstm
        inputs = CoreInputs(np.zeros(2, np.int64), np.zeros(2, np.float32), np.ones(2, bool),
                            (torch.zeros(2, state_size), torch.zeros(2, state_size)))
        obs = np.zeros((2, *spec.obs_shape), np.uint8)
        stranger = _refusable_socket(zmq.DEALER, o["endpoints.inference"])
        _send_or_refused(stranger, codec.encode(REQUEST, request_arrays(obs, inputs), meta={"id": "1"}))
        assert not stranger.poll(2000), "a stranger was answered"
        stranger.close()
        network = RemoteNetwork(cfg, "actor-0", spec, cfg.num_policies, state_size, threading.Event())
        out = network.forward(obs, inputs)   # secure_client_socket: the run's CURVE keys
        network.close()
        assert out.adv.shape == (1, 2, cfg.num_policies, spec.num_actions) and network.version >= 0
    finally:
        assert inference.stop() == 0, inference.log()[-2000:]
