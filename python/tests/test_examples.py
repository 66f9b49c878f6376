"""The examples (examples/python/) run as their headers say, against the installed package."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

from leasehold.testing import Sidecar

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples", "python")


def test_the_client_example_owns_appends_and_releases(leasehold_sidecar: Sidecar) -> None:
    run = subprocess.run(
        [sys.executable, os.path.join(EXAMPLES, "client.py"), leasehold_sidecar.address, str(uuid.uuid4())],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, (run.stdout, run.stderr)
    assert "appended step 9 at 11" in run.stdout, run.stdout


def test_the_agent_runtime_resumes_from_the_journal_and_stops_on_sigterm_and_on_loss(
    leasehold_sidecar: Sidecar,
) -> None:
    sessions = [str(uuid.uuid4()), str(uuid.uuid4())]
    script = os.path.join(EXAMPLES, "agent_runtime.py")

    def start(*names: str) -> subprocess.Popen[str]:
        command = [sys.executable, script, leasehold_sidecar.address, *names]
        return subprocess.Popen(command, stdout=subprocess.PIPE, text=True)

    # SIGTERM: each agent stops between two steps and releases its session.
    worker = start(*sessions)
    time.sleep(1.5)
    worker.send_signal(signal.SIGTERM)
    out, _ = worker.communicate(timeout=30)
    assert worker.returncode == 0, out
    assert out.count("; released") == 2, out

    # Another worker resumes after the last step in the journal; the sidecar dies under it.
    worker = start(sessions[0])
    assert worker.stdout is not None
    resumed = worker.stdout.readline()
    assert "resuming after step" in resumed and "after step 0" not in resumed, resumed
    leasehold_sidecar.restart()
    out, _ = worker.communicate(timeout=60)
    assert worker.returncode == 0, out
    assert "lost (stream_ended)" in out or "ownership ended (not_owner)" in out, out
