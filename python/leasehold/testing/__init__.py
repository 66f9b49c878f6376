"""Real parts for tests of services that use leasehold: a throwaway etcd, a ``leasehold serve``
in front of it, and a fault proxy between a client and the sidecar.

- :class:`Etcd` runs etcd as a process (the binary at ``$LEASEHOLD_ETCD_BIN``, or ``etcd`` on
  ``PATH``) on free ports with its data in a temporary directory, or, when there is no binary
  and ``$LEASEHOLD_ETCD_IMAGE`` names an image (such as the ``leasehold-etcd:3.5.16`` that the
  Rust harness builds), in a container through testcontainers. Neither: :class:`SetupError`,
  never a skipped test.
- :class:`Sidecar` runs ``leasehold serve`` (the binary at ``$LEASEHOLD_BIN``, or ``leasehold``
  on ``PATH``: the one this package installs) against it, in a namespace of its own.
- :class:`FaultProxy` sits between a client and a sidecar: :meth:`~FaultProxy.freeze` holds
  every byte (the client looks frozen: the sidecar ends its ownerships when its keepalive
  pings go unanswered), :meth:`~FaultProxy.drop_replies` lets requests through and drops the
  answers, :meth:`~FaultProxy.cut` closes every connection.

The pytest plugin (``leasehold.testing.plugin``, loaded when the package is installed) makes
fixtures of them: ``leasehold_etcd``, ``leasehold_sidecar``, ``leasehold_client``,
``leasehold_fault`` and ``leasehold_sidecars`` (a factory, for more sidecars on one etcd).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from typing import IO, Optional

from ._proxy import FaultProxy

__all__ = ["Etcd", "Sidecar", "FaultProxy", "SetupError", "free_port"]


class SetupError(RuntimeError):
    """A part a test needs could not be started: the message says which, and what to install."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_listening(
    address: str,
    timeout: float,
    what: str,
    alive: Optional[subprocess.Popen[bytes]] = None,
) -> None:
    """Waits until something accepts connections at ``address`` (``host:port`` or
    ``unix:/path``); :class:`SetupError` if ``alive`` exits first, or after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if alive is not None and alive.poll() is not None:
            raise SetupError(f"{what} exited with {alive.returncode} before it listened")
        try:
            if address.startswith("unix:"):
                with socket.socket(socket.AF_UNIX) as probe:
                    probe.connect(address[len("unix:") :])
            else:
                host, port = address.rsplit(":", 1)
                with socket.create_connection((host, int(port)), timeout=0.5):
                    pass
            return
        except OSError:
            time.sleep(0.05)
    raise SetupError(f"{what} did not listen on {address} within {timeout:.0f} s")


class Etcd:
    """A throwaway single-member etcd. ``endpoint`` is its client URL; :meth:`stop` ends it."""

    def __init__(self, endpoint: str, process: Optional[subprocess.Popen[bytes]], data: Optional[str], container: object = None) -> None:
        self.endpoint = endpoint
        self._process = process
        self._data = data
        self._container = container

    @staticmethod
    def start() -> Etcd:
        """Starts etcd: the binary if there is one, else the image (see the module docs)."""
        binary = os.environ.get("LEASEHOLD_ETCD_BIN") or shutil.which("etcd")
        if binary:
            return Etcd._process_from(binary)
        image = os.environ.get("LEASEHOLD_ETCD_IMAGE")
        if image:
            return Etcd._container_from(image)
        raise SetupError(
            "no etcd: set LEASEHOLD_ETCD_BIN to an etcd binary, put etcd on PATH, or set "
            "LEASEHOLD_ETCD_IMAGE to an etcd image (with Docker running)"
        )

    @staticmethod
    def _process_from(binary: str) -> Etcd:
        data = tempfile.mkdtemp(prefix="leasehold-etcd-")
        client, peer = free_port(), free_port()
        endpoint = f"http://127.0.0.1:{client}"
        peer_url = f"http://127.0.0.1:{peer}"
        log = open(os.path.join(data, "etcd.log"), "wb")
        process = subprocess.Popen(
            [
                binary,
                "--name=test",
                f"--data-dir={os.path.join(data, 'data')}",
                f"--listen-client-urls={endpoint}",
                f"--advertise-client-urls={endpoint}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=test={peer_url}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        etcd = Etcd(endpoint, process, data)
        try:
            _wait_listening(f"127.0.0.1:{client}", 30, f"etcd ({binary})", process)
        except SetupError:
            etcd.stop()
            raise
        return etcd

    @staticmethod
    def _container_from(image: str) -> Etcd:
        # testcontainers' reaper is one more image to pull; the container is removed by stop(),
        # and labelled as the Rust harness labels its own (org.leasehold.testing).
        os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")
        try:
            from testcontainers.core.container import DockerContainer
        except ImportError:
            raise SetupError(
                "etcd in a container needs testcontainers: pip install 'leasehold[testing]'"
            ) from None
        container = DockerContainer(image, labels={"org.leasehold.testing": "python"})
        container = container.with_exposed_ports(2379).with_command(
            [
                "--name=test",
                "--data-dir=/tmp/etcd",
                "--listen-client-urls=http://0.0.0.0:2379",
                "--advertise-client-urls=http://127.0.0.1:2379",
            ]
        )
        try:
            container.start()
        except Exception as error:  # the Docker engine's own errors
            raise SetupError(f"etcd image {image} did not start: {error}") from error
        host = container.get_container_host_ip()
        port = int(container.get_exposed_port(2379))
        _wait_listening(f"{host}:{port}", 30, f"etcd ({image})")
        return Etcd(f"http://{host}:{port}", None, None, container)

    def stop(self) -> None:
        """Ends etcd and removes its data."""
        if self._process is not None:
            self._process.kill()
            self._process.wait()
        if self._container is not None:
            self._container.stop()  # type: ignore[attr-defined]
        if self._data is not None:
            shutil.rmtree(self._data, ignore_errors=True)

    def __enter__(self) -> Etcd:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


class Sidecar:
    """``leasehold serve`` on a free port of 127.0.0.1 (or, with ``unix``, on a Unix socket),
    over ``etcd``, in ``namespace`` (a new random one by default). ``address`` is where clients
    connect; it stays the same across :meth:`restart`. ``tls``: the paths of the server's
    certificate chain and key (PEM), for ``--listen-cert`` and ``--listen-key``."""

    def __init__(
        self,
        etcd: Etcd,
        *,
        namespace: Optional[str] = None,
        node: Optional[str] = None,
        ttl: int = 5,
        client_keepalive: str = "1s",
        unix: bool = False,
        tls: Optional[tuple[str, str]] = None,
        args: tuple[str, ...] = (),
    ) -> None:
        self.etcd = etcd
        self.namespace = namespace or f"test-{uuid.uuid4().hex[:12]}"
        self.node = node or f"sidecar-{uuid.uuid4().hex[:6]}"
        self.port = 0 if unix else free_port()
        self._socket = (
            os.path.join(tempfile.mkdtemp(prefix="leasehold-serve-"), "leasehold.sock")
            if unix
            else None
        )
        self.address = f"unix:{self._socket}" if self._socket else f"127.0.0.1:{self.port}"
        #: What it printed, as of :meth:`close`.
        self.log_text = ""
        tls_args = ("--listen-cert", tls[0], "--listen-key", tls[1]) if tls else ()
        binary = os.environ.get("LEASEHOLD_BIN") or shutil.which("leasehold")
        if not binary:
            raise SetupError(
                "no leasehold binary: pip install leasehold puts it on the environment's PATH, "
                "or set LEASEHOLD_BIN"
            )
        self._command = [
            binary,
            "--endpoints",
            etcd.endpoint,
            "--namespace",
            self.namespace,
            "--node",
            self.node,
            "--ttl",
            str(ttl),
            "--no-version-warning",
            "serve",
            "--listen",
            self.address,
            "--client-keepalive",
            client_keepalive,
            *tls_args,
            *args,
        ]
        self._process: Optional[subprocess.Popen[bytes]] = None
        with tempfile.NamedTemporaryFile(prefix="leasehold-serve-", suffix=".log", delete=False) as log:
            self._log = log.name
        try:
            self.start()
        except SetupError as error:
            self.close()
            raise SetupError(f"{error}; it printed:\n{self.log_text}") from None

    def start(self) -> None:
        """Starts it (again), and waits until it serves."""
        log: IO[bytes] = open(self._log, "ab")
        self._process = subprocess.Popen(self._command, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        _wait_listening(self.address, 60, "leasehold serve", self._process)

    @property
    def pid(self) -> int:
        assert self._process is not None
        return self._process.pid

    def log(self) -> str:
        """What it printed so far."""
        try:
            with open(self._log, "rb") as log:
                return log.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def kill(self) -> None:
        """SIGKILL: it ends at once, releasing nothing; its node lease ends with its TTL."""
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGKILL)
            self._process.wait()

    def pause(self) -> None:
        """SIGSTOP: a sidecar frozen mid-flight (a long GC pause, a stopped VM)."""
        assert self._process is not None
        self._process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT, after :meth:`pause`."""
        assert self._process is not None
        self._process.send_signal(signal.SIGCONT)

    def restart(self) -> None:
        """SIGKILL, then started again on the same address (with a new node lease)."""
        self.kill()
        self.start()

    def stop(self, timeout: float = 15) -> int:
        """SIGTERM (every stream's sessions released, then its store closed); its exit code."""
        if self._process is None:
            return 0
        if self._process.poll() is None:
            self._process.send_signal(signal.SIGCONT)
            self._process.send_signal(signal.SIGTERM)
            try:
                self._process.wait(timeout)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        return int(self._process.returncode)

    def close(self) -> None:
        """Stops it and removes its log (and its socket's directory)."""
        self.log_text = self.log()
        self.stop()
        if os.path.exists(self._log):
            os.unlink(self._log)
        if self._socket is not None:
            shutil.rmtree(os.path.dirname(self._socket), ignore_errors=True)

    def __enter__(self) -> Sidecar:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

