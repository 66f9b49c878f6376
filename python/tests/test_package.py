"""The package itself: its stubs match the proto, its errors cover every reason the sidecar
gives, and its etcd starts in a container too."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid

import leasehold
from leasehold import _errors
from leasehold.testing import Etcd, Sidecar

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.dirname(HERE)
PROTO = os.path.join(os.path.dirname(PACKAGE), "proto", "leasehold", "v1", "leasehold.proto")


def test_the_checked_in_stubs_match_the_proto() -> None:
    run = subprocess.run(
        [sys.executable, os.path.join(PACKAGE, "generate.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr


def test_every_reason_of_the_proto_has_its_exception() -> None:
    with open(PROTO) as proto:
        text = proto.read()
    listed = text[text.index("whose `reason` is one of:") : text.index("ErrorInfo metadata")]
    reasons: set[str] = set()
    for line in listed.splitlines():
        # `//   REASON   CODE  what it means`, or `//   REASON, REASON,`: reasons at 3 spaces.
        names = re.match(r"^//   ([A-Z][A-Z_, ]*?)(?:\s{2,}|$)", line)
        if names:
            reasons |= {name.strip() for name in names.group(1).split(",") if name.strip()}
    assert "FENCED" in reasons and "TOO_MANY_WATCHES" in reasons, reasons
    assert reasons == set(_errors.REASONS), reasons ^ set(_errors.REASONS)
    for reason, kind in _errors.REASONS.items():
        assert issubclass(kind, leasehold.LeaseholdError), reason
        assert kind.__doc__, f"{kind.__name__} says whether retrying helps"
    for never in ("FENCED", "LEASE_LOST", "NOT_OWNER", "NOT_HOLDER"):
        assert issubclass(_errors.REASONS[never], leasehold.OwnershipEnded)
        assert not _errors.REASONS[never].retryable
    assert _errors.REASONS["ETCD_UNAVAILABLE"].retryable


def test_etcd_starts_from_an_image_through_testcontainers() -> None:
    image = os.environ.get("LEASEHOLD_ETCD_IMAGE")
    assert image, "set LEASEHOLD_ETCD_IMAGE to an etcd image (deploy/dev.sh test sets it)"
    saved = os.environ.pop("LEASEHOLD_ETCD_BIN", None)
    try:
        with Etcd._container_from(image) as etcd, Sidecar(etcd) as sidecar:
            with leasehold.connect_sync(sidecar.address) as client:
                session = uuid.uuid4()
                with client.own(session) as own:
                    assert own.append(b"in a container").first_seq > 0
    finally:
        if saved is not None:
            os.environ["LEASEHOLD_ETCD_BIN"] = saved


def test_the_package_brings_the_leasehold_command() -> None:
    """Installed, the package puts `leasehold` beside the environment's Python (unless a test
    run names another binary with LEASEHOLD_BIN)."""
    binary = os.environ.get("LEASEHOLD_BIN")
    if binary is None:
        binary = os.path.join(os.path.dirname(sys.executable), "leasehold")
        assert os.access(binary, os.X_OK), f"no leasehold beside {sys.executable}"
        assert os.path.dirname(leasehold.__file__).startswith(sys.prefix), leasehold.__file__
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True)
    assert version.stdout.split() == ["leasehold", leasehold.__version__], version.stdout
