"""Who may talk to the services: mutual TLS on gRPC, CURVE on ZeroMQ (security.enabled).

One certificate folder serves a whole run (`lbc certs DIR` makes it; the launcher makes one in
<run_dir>/certs when security is on and the folder is missing; on Kubernetes it is the Secret
`lbc-certs`):

    ca.pem                      the run's certificate authority (its key, ca.key, only signs)
    server.pem, server.key      what every gRPC server presents (names: localhost, 127.0.0.1, the
                                cluster's Service names)
    client.pem, client.key      what every gRPC client presents; servers accept only certificates
                                the run's CA signed
    curve/server.key(_secret)   replay's and the inference service's CURVE key pair
    curve/client.key(_secret)   the actors' and the learner's CURVE key pair; replay and the inference
                                service accept only the public keys in curve/clients/

A peer without the run's certificates or keys cannot pull or push parameters, report returns, send
sequences or draw batches: the TLS handshake or the ZAP handshake refuses it before any message.
"""

from __future__ import annotations

import datetime
import ipaddress
import shutil
from pathlib import Path

import grpc
import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from lbc.config import Config

# the Service names of k8s/base, short and qualified, and loopback for `make run`
DEFAULT_HOSTS = ("localhost", "127.0.0.1", "::1", *(f"lbc-{s}{d}" for s in ("learner", "bandit", "replay")
                                                     for d in ("", ".lbc", ".lbc.svc", ".lbc.svc.cluster.local")))
CA_CERT = "ca.pem"


def make_certificates(directory: Path, hosts: tuple[str, ...] = DEFAULT_HOSTS, days: int = 825) -> None:
    """A fresh CA, a server and a client certificate signed by it, and CURVE key pairs, in `directory`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)

    def name(common: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "lbc"),
                          x509.NameAttribute(NameOID.COMMON_NAME, common)])

    def write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
        path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
        path.chmod(0o600)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name("lbc run CA")).issuer_name(name("lbc run CA"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .sign(ca_key, hashes.SHA256()))
    write_key(ca_key, directory / "ca.key")
    (directory / CA_CERT).write_bytes(ca.public_bytes(serialization.Encoding.PEM))

    sans: list[x509.GeneralName] = []
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    for role, usage in (("server", ExtendedKeyUsageOID.SERVER_AUTH), ("client", ExtendedKeyUsageOID.CLIENT_AUTH)):
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (x509.CertificateBuilder().subject_name(name(f"lbc {role}")).issuer_name(ca.subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=days))
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
        if role == "server":
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        write_key(key, directory / f"{role}.key")
        (directory / f"{role}.pem").write_bytes(builder.sign(ca_key, hashes.SHA256()).public_bytes(
            serialization.Encoding.PEM))

    curve = directory / "curve"
    if curve.exists():
        shutil.rmtree(curve)
    (curve / "clients").mkdir(parents=True)
    zmq.auth.create_certificates(curve, "server")
    zmq.auth.create_certificates(curve, "client")
    shutil.copy(curve / "client.key", curve / "clients" / "client.key")   # the public key replay accepts


def check_certificates(directory: Path) -> None:
    """Raise ValueError naming what is missing, so a service stops at start with one clear line."""
    needed = [CA_CERT, "server.pem", "server.key", "client.pem", "client.key", "curve/server.key",
              "curve/server.key_secret", "curve/client.key", "curve/client.key_secret"]
    missing = [n for n in needed if not (directory / n).is_file()]
    if missing or not any((directory / "curve" / "clients").glob("*.key")):
        raise ValueError(f"security.enabled needs the run's certificates in {directory} (missing: "
                         f"{', '.join(missing) or 'curve/clients/*.key'}); make them with `lbc certs {directory}` "
                         f"or set security.enabled=false")


def server_credentials(directory: Path) -> grpc.ServerCredentials:
    """TLS with the server certificate; only clients whose certificate the run's CA signed get in."""
    pair = ((directory / "server.key").read_bytes(), (directory / "server.pem").read_bytes())
    return grpc.ssl_server_credentials([pair], root_certificates=(directory / CA_CERT).read_bytes(),
                                       require_client_auth=True)


def channel_credentials(directory: Path) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials((directory / CA_CERT).read_bytes(), (directory / "client.key").read_bytes(),
                                        (directory / "client.pem").read_bytes())


_authenticator: ThreadAuthenticator | None = None


def curve_server(sock: zmq.Socket, directory: Path) -> None:
    """Make `sock` a CURVE server that accepts only the public keys in curve/clients/ (ZAP, checked
    before any message is delivered). Call before bind()."""
    global _authenticator
    if _authenticator is None:   # one ZAP handler per process, for the shared context
        _authenticator = ThreadAuthenticator(zmq.Context.instance())
        _authenticator.start()
        _authenticator.configure_curve(domain="*", location=str(directory / "curve" / "clients"))
    public, secret = zmq.auth.load_certificate(directory / "curve" / "server.key_secret")
    sock.curve_publickey, sock.curve_secretkey = public, secret
    sock.curve_server = True


def curve_client(sock: zmq.Socket, directory: Path) -> None:
    """Make `sock` a CURVE client of replay with the run's client keys. Call before connect()."""
    public, secret = zmq.auth.load_certificate(directory / "curve" / "client.key_secret")
    server_public, _ = zmq.auth.load_certificate(directory / "curve" / "server.key")
    sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = public, secret, server_public


# --- what the services call: each is a no-op or None when security is off --------------------------


def server_credentials_of(cfg: Config) -> grpc.ServerCredentials | None:
    return server_credentials(cfg.certs_path) if cfg.security.enabled else None


def channel_credentials_of(cfg: Config) -> grpc.ChannelCredentials | None:
    return channel_credentials(cfg.certs_path) if cfg.security.enabled else None


def secure_server_socket(sock: zmq.Socket, cfg: Config) -> None:
    if cfg.security.enabled:
        curve_server(sock, cfg.certs_path)


def secure_client_socket(sock: zmq.Socket, cfg: Config) -> None:
    if cfg.security.enabled:
        curve_client(sock, cfg.certs_path)
