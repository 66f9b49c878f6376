"""The transports a client may use: a Unix socket, and TLS."""

from __future__ import annotations

import asyncio
import os
import subprocess
import tempfile
import uuid

import pytest

import leasehold
from leasehold.testing import Etcd, Sidecar


def test_a_sidecar_on_a_unix_socket(leasehold_etcd: Etcd) -> None:
    with Sidecar(leasehold_etcd, unix=True) as sidecar:
        assert sidecar.address.startswith("unix:/")

        async def main() -> None:
            async with leasehold.connect(sidecar.address) as client:
                async with client.own(uuid.uuid4()) as own:
                    assert (await own.append(b"over a socket")).first_seq > 0

        asyncio.run(main())


def certificates(directory: str) -> tuple[str, str, str]:
    """A CA, and a certificate it signed for 127.0.0.1 with its key: their PEM paths."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
            "-days", "1", "-subj", "/CN=leasehold test CA")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
            "-subj", "/CN=127.0.0.1")
    with open(os.path.join(directory, "san.ext"), "w") as ext:
        ext.write("subjectAltName=IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "server.pem", "-days", "1", "-extfile", "san.ext")
    return tuple(os.path.join(directory, name) for name in ("ca.pem", "server.pem", "server.key"))  # type: ignore[return-value]


def test_a_sidecar_serving_tls(leasehold_etcd: Etcd) -> None:
    with tempfile.TemporaryDirectory() as directory:
        ca, cert, key = certificates(directory)
        with open(ca, "rb") as pem:
            tls = leasehold.Tls(root_certificates=pem.read())
        with Sidecar(leasehold_etcd, tls=(cert, key)) as sidecar:
            with leasehold.connect_sync(sidecar.address, tls=tls) as client:
                with client.own(uuid.uuid4()) as own:
                    assert own.append(b"over TLS").first_seq > 0
            # Without TLS the sidecar cannot be reached: a typed error, retryable, not a hang.
            quick = leasehold.RetryPolicy(timeout=1.0, attempt_timeout=0.5)
            with leasehold.connect_sync(sidecar.address, retry=quick) as plain:
                with pytest.raises(leasehold.Unavailable):
                    plain.validate(uuid.uuid4(), 1)
