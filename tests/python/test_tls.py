"""TLS on every gRPC hop (#31), with certificates made by the openssl command line here: the three
services with mutual TLS inside (gateway to scheduler, scheduler to worker) and TLS on the public
front. A TLS client is served; a plaintext one, one trusting another CA, and (with --tls-client-ca)
one without a client certificate, with one from another CA, or with an expired one are refused at
the handshake; an internal server refuses a caller without a client certificate; a certificate
swapped on disk is presented to new connections while a stream already open finishes."""
import socket
import ssl
import subprocess
import threading
import time

import grpc
import pytest

from conftest import Stack, binary
from faults import Proc

REFRESH_S = 1  # --tls-refresh-s: how soon a swapped file is read


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


class Pki:
    """A CA and the certificates it signs, in one folder (EC P-256 keys)."""

    def __init__(self, folder, name):
        self.dir, self.name = folder, name
        folder.mkdir(parents=True, exist_ok=True)
        openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                "-keyout", f"{name}-ca.key", "-out", f"{name}-ca.pem", "-days", "2", "-subj", f"/CN={name} test CA",
                cwd=folder)
        self.ca = folder / f"{name}-ca.pem"

    def issue(self, cn, days=2, file_stem=None):
        """A certificate for `cn` valid for loopback (IP 127.0.0.1, DNS localhost), as server and client;
        days < 0 makes one that has expired. Returns (cert path, key path)."""
        stem = file_stem or f"{self.name}-{cn}"
        (self.dir / f"{stem}.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                                              "extendedKeyUsage=serverAuth,clientAuth\n")
        openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout",
                f"{stem}.key", "-out", f"{stem}.csr", "-subj", f"/CN={cn}", cwd=self.dir)
        openssl("x509", "-req", "-in", f"{stem}.csr", "-CA", self.ca.name, "-CAkey", f"{self.name}-ca.key",
                "-CAcreateserial", "-out", f"{stem}.pem", "-days", str(days), "-extfile", f"{stem}.ext", cwd=self.dir)
        return self.dir / f"{stem}.pem", self.dir / f"{stem}.key"


def tls_args(cert, key, ca=None):
    args = ["--tls-cert", str(cert), "--tls-key", str(key), "--tls-refresh-s", str(REFRESH_S)]
    return args + (["--tls-ca", str(ca)] if ca else [])


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    root = tmp_path_factory.mktemp("pki")
    return Pki(root, "ferry"), Pki(root, "other")


@pytest.fixture(scope="module")
def stack(tiny_model, pki, tmp_path_factory):
    """worker <- scheduler <- gateway, mutual TLS inside; the gateway's public front serves TLS, and a
    second gateway on the same scheduler requires client certificates (--tls-client-ca)."""
    ca, _ = pki
    run = tmp_path_factory.mktemp("tls-run")
    log = open(run / "services.log", "wb")
    procs = {}
    try:
        w_cert, w_key = ca.issue("worker")
        s_cert, s_key = ca.issue("scheduler")
        g_cert, g_key = ca.issue("gateway")
        procs["worker"] = Proc("worker", [binary("ferry-worker"), "--model", str(tiny_model), "--port", "0",
                                          "--num-kv-blocks", "256", *tls_args(w_cert, w_key, ca.ca)], run, log)
        procs["scheduler"] = Proc("scheduler", [binary("ferry-scheduler"), "--port", "0", "--worker",
                                                procs["worker"].address, *tls_args(s_cert, s_key, ca.ca)], run, log)
        gateway = [binary("ferry-gateway"), "--port", "0", "--scheduler", procs["scheduler"].address,
                   "--tokenizer", str(tiny_model), "--http-port", "0", "--served-model-name", "m",
                   *tls_args(g_cert, g_key, ca.ca)]
        procs["gateway"] = Proc("gateway", gateway, run, log)
        procs["gateway_mtls"] = Proc("gateway_mtls", [*gateway, "--tls-client-ca", str(ca.ca)], run, log)
        yield procs, run
    finally:
        for name in ("gateway_mtls", "gateway", "scheduler", "worker"):
            if name in procs:
                procs[name].stop()
        log.close()


def generate(address, pb, credentials=None, max_tokens=4, timeout_s=60):
    """One Generate through the gateway at `address`: its tokens, or the grpc.RpcError it raised."""
    channel = grpc.secure_channel(address, credentials) if credentials else grpc.insecure_channel(address)
    try:
        stub = pb.gen_grpc.GenerationStub(channel)
        request = pb.gen.GenerateRequest(text=b"hello over tls",
                                         sampling=pb.gen.SamplingParams(max_tokens=max_tokens, ignore_eos=True))
        return list(stub.Generate(request, timeout=timeout_s).token_ids)
    except grpc.RpcError as e:
        return e
    finally:
        channel.close()


def creds(ca_pem, cert=None, key=None):
    return grpc.ssl_channel_credentials(root_certificates=ca_pem.read_bytes(),
                                        private_key=key.read_bytes() if key else None,
                                        certificate_chain=cert.read_bytes() if cert else None)


def refused(result):
    return isinstance(result, grpc.RpcError) and result.code() == grpc.StatusCode.UNAVAILABLE


def test_a_tls_client_is_served_and_a_plaintext_or_wrong_ca_one_refused(stack, pki, ferry_pb):
    procs, _ = stack
    ca, other = pki
    tokens = generate(procs["gateway"].address, ferry_pb, creds(ca.ca))
    assert isinstance(tokens, list) and len(tokens) == 4, tokens
    assert refused(generate(procs["gateway"].address, ferry_pb, None, timeout_s=5))
    assert refused(generate(procs["gateway"].address, ferry_pb, creds(other.ca), timeout_s=5))


def test_client_certificates_when_the_front_requires_them(stack, pki, ferry_pb):
    procs, _ = stack
    ca, other = pki
    address = procs["gateway_mtls"].address
    good = ca.issue("api-client")
    wrong_ca = other.issue("api-client")
    expired = ca.issue("api-client-expired", days=-1)
    tokens = generate(address, ferry_pb, creds(ca.ca, *good))
    assert isinstance(tokens, list) and len(tokens) == 4, tokens
    assert refused(generate(address, ferry_pb, creds(ca.ca), timeout_s=5)), "no client certificate"
    assert refused(generate(address, ferry_pb, creds(ca.ca, *wrong_ca), timeout_s=5)), "another CA's"
    assert refused(generate(address, ferry_pb, creds(ca.ca, *expired), timeout_s=5)), "expired"


def openai_client(port, ca_pem, cert=None):
    import httpx
    import openai

    context = ssl.create_default_context(cafile=str(ca_pem))
    if cert:
        context.load_cert_chain(str(cert[0]), str(cert[1]))
    http = httpx.Client(verify=context, timeout=30)
    return openai.OpenAI(base_url=f"https://127.0.0.1:{port}/v1", api_key="unused", http_client=http,
                         max_retries=0)


def completion(port, ca_pem, cert=None, model="m"):
    """A completion over HTTPS: its text, or the exception the client raised."""
    import openai

    try:
        r = openai_client(port, ca_pem, cert).completions.create(model=model, prompt="hello", max_tokens=3)
        return r.choices[0].text
    except openai.APIConnectionError as e:
        return e


def test_the_openai_client_is_served_over_https_with_a_ca_bundle(stack, pki):
    import openai

    procs, _ = stack
    ca, other = pki
    port = procs["gateway"].http_port
    assert isinstance(completion(port, ca.ca), str)
    assert isinstance(completion(port, other.ca), openai.APIConnectionError), "a server another CA signed"
    import urllib.error
    import urllib.request
    with pytest.raises((urllib.error.URLError, ConnectionError)):  # plaintext HTTP to the TLS port
        urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5).read()
    # With --tls-client-ca: a client certificate from the CA, and nothing else, is served.
    mtls = procs["gateway_mtls"].http_port
    assert isinstance(completion(mtls, ca.ca, ca.issue("http-client")), str)
    assert isinstance(completion(mtls, ca.ca), openai.APIConnectionError), "no client certificate"
    assert isinstance(completion(mtls, ca.ca, other.issue("http-client")), openai.APIConnectionError)
    assert isinstance(completion(mtls, ca.ca, ca.issue("http-expired", days=-1)), openai.APIConnectionError)


def get_state(address, pb, credentials):
    channel = grpc.secure_channel(address, credentials) if credentials else grpc.insecure_channel(address)
    try:
        return pb.sched_grpc.SchedulerStub(channel).GetState(pb.sched.GetStateRequest(), timeout=5)
    except grpc.RpcError as e:
        return e
    finally:
        channel.close()


def test_an_internal_hop_without_a_client_certificate_is_refused(stack, pki, ferry_pb):
    procs, _ = stack
    ca, other = pki
    scheduler = procs["scheduler"].address
    assert refused(get_state(scheduler, ferry_pb, creds(ca.ca))), "TLS without a client certificate"
    assert refused(get_state(scheduler, ferry_pb, None)), "plaintext"
    assert refused(get_state(scheduler, ferry_pb, creds(ca.ca, *other.issue("intruder")))), "another CA's"
    state = get_state(scheduler, ferry_pb, creds(ca.ca, *ca.issue("peer")))
    assert not isinstance(state, grpc.RpcError), state


def probe(address, service, ca_pem, cert=None):
    """ferry-client --health: the exec probe the manifests use once TLS is on."""
    args = [str(binary("ferry-client")), "--health", service, "--target", address, "--tls-ca", str(ca_pem)]
    if cert:
        args += ["--tls-cert", str(cert[0]), "--tls-key", str(cert[1])]
    return subprocess.run(args, capture_output=True, text=True, timeout=30)


def test_the_health_probe_speaks_tls_and_mutual_tls(stack, pki):
    procs, _ = stack
    ca, _ = pki
    for service in ("", "liveness"):
        done = probe(procs["gateway"].address, service, ca.ca)
        assert done.returncode == 0 and "SERVING" in done.stdout, done.stdout + done.stderr
    peer = ca.issue("probe")
    assert probe(procs["scheduler"].address, "", ca.ca).returncode == 1  # no client certificate
    done = probe(procs["scheduler"].address, "liveness", ca.ca, peer)
    assert done.returncode == 0, done.stdout + done.stderr
    assert probe(procs["worker"].address, "", ca.ca, peer).returncode == 0
    assert probe(procs["worker"].address, "no-such-service", ca.ca, peer).returncode == 1


def peer_certificate_cn(port, ca_pem):
    """The CN of the certificate the server on `port` presents to a new TLS connection."""
    context = ssl.create_default_context(cafile=str(ca_pem))
    context.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            subject = dict(item[0] for item in tls.getpeercert()["subject"])
    return subject["commonName"]


def test_a_certificate_swapped_on_disk_is_used_by_new_connections_while_a_stream_finishes(stack, pki, ferry_pb):
    procs, run = stack
    ca, _ = pki
    gateway = procs["gateway"]
    port = gateway.ports["grpc_port"]
    assert peer_certificate_cn(port, ca.ca) == "gateway"
    # A stream opened before the swap, long enough to span it.
    channel = grpc.secure_channel(gateway.address, creds(ca.ca))
    stub = ferry_pb.gen_grpc.GenerationStub(channel)
    request = ferry_pb.gen.GenerateRequest(text=b"a long answer",
                                           sampling=ferry_pb.gen.SamplingParams(max_tokens=400, ignore_eos=True))
    call = stub.GenerateStream(request, timeout=120)
    first = next(call)
    assert first.token_ids
    # Rotate: a new certificate and key written over the files the gateway was started with.
    g_cert, g_key = ca.dir / "ferry-gateway.pem", ca.dir / "ferry-gateway.key"
    new_cert, new_key = ca.issue("gateway-rotated")
    g_key.write_bytes(new_key.read_bytes())
    g_cert.write_bytes(new_cert.read_bytes())
    deadline = time.time() + 10 * REFRESH_S + 5
    while peer_certificate_cn(port, ca.ca) != "gateway-rotated":
        assert time.time() < deadline, "the rotated certificate was not presented to new connections"
        time.sleep(0.2)
    tokens = list(first.token_ids)
    for chunk in call:
        tokens += chunk.token_ids
    assert len(tokens) == 400 and call.code() == grpc.StatusCode.OK
    channel.close()
    # New connections are served with the rotated certificate, on the HTTP front too.
    assert len(generate(gateway.address, ferry_pb, creds(ca.ca))) == 4
    deadline = time.time() + 10 * REFRESH_S + 5
    while peer_certificate_cn(gateway.http_port, ca.ca) != "gateway-rotated":
        assert time.time() < deadline, "the HTTP front did not present the rotated certificate"
        time.sleep(0.2)
    assert isinstance(completion(gateway.http_port, ca.ca), str)


def test_launch_tls_auto_serves_every_hop_with_its_throwaway_ca(tiny_model, tmp_path, ferry_pb):
    """ferry-launch --tls auto: one flag, and the quickstart runs with TLS on every hop."""
    stack = Stack(tiny_model, tmp_path, ["--tls", "auto", "--http-port", "0", "--served-model-name", "m"])
    try:
        tls = tmp_path / "tls"
        ca = tls / "ca.pem"
        for name in ("ca", "worker", "scheduler", "gateway", "launch"):
            assert (tls / f"{name}.key").stat().st_mode & 0o077 == 0, f"{name}.key is readable by others"
        tokens = generate(stack.gateway, ferry_pb, creds(ca))
        assert isinstance(tokens, list) and len(tokens) == 4, tokens
        assert refused(generate(stack.gateway, ferry_pb, None, timeout_s=5)), "plaintext to the gateway"
        assert isinstance(completion(stack.ports["gateway"]["http_port"], ca), str)
        # Inside, mutual TLS: a caller with only the CA is refused by the scheduler and the worker.
        assert refused(get_state(stack.scheduler, ferry_pb, creds(ca)))
        worker = f"127.0.0.1:{stack.ports['workers'][0]['grpc_port']}"
        from grpc_health.v1 import health_pb2, health_pb2_grpc
        for credentials in (None, creds(ca)):
            channel = grpc.secure_channel(worker, credentials) if credentials else grpc.insecure_channel(worker)
            with pytest.raises(grpc.RpcError) as e:
                health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE
            channel.close()
        # The command it prints works.
        done = subprocess.run([str(binary("ferry-client")), "--target", stack.gateway, "--tls-ca", str(ca),
                               "--max-tokens", "3", "hello"], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"--tls-ca {ca}" in stack.log_text()
    finally:
        assert stack.stop() == 0
