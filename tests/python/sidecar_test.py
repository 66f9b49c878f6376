"""Python clients of `leasehold serve`, against a real sidecar over a real etcd.

Run by cli/tests/sidecar_python.rs: `sidecar_test.py ADDRESS`. Generates the stubs from
proto/leasehold/v1/leasehold.proto, then:

1. two client processes race for one session; the holder appends;
2. the holder is killed with SIGKILL: the other owns the session within 2 s, at a higher epoch,
   and the replay shows its fence right after the dead owner's last event;
3. an append under the dead owner's epoch is refused FAILED_PRECONDITION (FENCED or
   LEASE_LOST), and its record is not in the journal;
4. a client frozen with SIGSTOP loses its session within the keepalive timeout;
5. an append retried with the same request_id lands once;
6. health answers SERVING, and a call built through server reflection alone (no proto file)
   validates the owner.

(examples/python/, on the Python package, are run by the package's own tests.)

Exits 0 when every check holds; prints what it saw.
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def stubs():
    """Generates the stubs into a temporary directory and imports them."""
    from grpc_tools import protoc

    out = tempfile.mkdtemp(prefix="leasehold-stubs-")
    proto = os.path.join(ROOT, "proto")
    code = protoc.main(
        [
            "protoc",
            f"-I{proto}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            os.path.join(proto, "leasehold", "v1", "leasehold.proto"),
        ]
    )
    assert code == 0, f"protoc failed: {code}"
    sys.path.insert(0, out)
    from leasehold.v1 import leasehold_pb2, leasehold_pb2_grpc

    return leasehold_pb2, leasehold_pb2_grpc



def say(**line):
    print(json.dumps(line), flush=True)


def holder(address, session, appends):
    """A client process: stands by on `session`, and once it owns it appends `appends`
    events, printing what it gets; then waits to be killed."""
    import grpc
    import queue

    pb, rpc = stubs()
    channel = grpc.insecure_channel(address)
    client = rpc.LeaseholdStub(channel)
    requests = queue.Queue()
    requests.put(pb.AttachRequest(acquire=pb.Acquire(session=session, wait=True)))

    def outgoing():
        while True:
            yield requests.get()

    for response in client.Attach(outgoing()):
        kind = response.WhichOneof("event")
        if kind == "acquired":
            epoch = response.acquired.epoch
            say(event="acquired", pid=os.getpid(), epoch=epoch, tip=response.acquired.tip_seq)
            for i in range(appends):
                appended = client.Append(
                    pb.AppendRequest(
                        session=session,
                        epoch=epoch,
                        token=response.acquired.token,
                        payloads=[f"{os.getpid()} {i}".encode()],
                        request_id=f"{os.getpid()}-{i}",
                    )
                )
                say(event="appended", pid=os.getpid(), seq=appended.last_seq)
        else:
            say(event=kind, pid=os.getpid())


def reason(error):
    """The ErrorInfo reason of a failed call, and its metadata."""
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status

    status = rpc_status.from_call(error)
    assert status is not None, f"no status details in {error}"
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            assert info.domain == "leasehold", info
            return info.reason, dict(info.metadata)
    raise AssertionError(f"no ErrorInfo in {status}")


class Lines:
    """The JSON lines of a client process, read as they come."""

    def __init__(self, process):
        self.process = process

    def next(self, timeout=10):
        import select

        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        assert ready, f"no line from {self.process.pid} within {timeout} s"
        line = self.process.stdout.readline()
        assert line, f"{self.process.pid} ended"
        return json.loads(line)


def spawn(address, session, appends):
    process = subprocess.Popen(
        [sys.executable, __file__, "holder", address, session, str(appends)],
        stdout=subprocess.PIPE,
        # Unbuffered: `select` then tells truly whether a line is waiting.
        bufsize=0,
    )
    return process


def replay(client, pb, session):
    return list(client.Replay(pb.ReplayRequest(session=session, records=True)))


def main(address):
    import grpc

    pb, rpc = stubs()
    channel = grpc.insecure_channel(address)
    client = rpc.LeaseholdStub(channel)
    session = str(uuid.uuid4())

    # --- 1. two clients race; the holder appends three events
    racers = [spawn(address, session, 3), spawn(address, session, 3)]
    lines = {p.pid: Lines(p) for p in racers}
    try:
        import select

        ready, _, _ = select.select([p.stdout for p in racers], [], [], 15)
        assert ready, "nobody acquired the session within 15 s"
        first = next(p for p in racers if p.stdout in ready)
        other = next(p for p in racers if p is not first)
        acquired = lines[first.pid].next()
        assert acquired["event"] == "acquired", acquired
        epoch = acquired["epoch"]
        last = None
        for _ in range(3):
            appended = lines[first.pid].next()
            assert appended["event"] == "appended", appended
            last = appended["seq"]
        say(check="holder appended", epoch=epoch, last_seq=last)

        # --- 2. SIGKILL the holder: the other owns it within 2 s, at a higher epoch
        killed = time.monotonic()
        first.send_signal(signal.SIGKILL)
        first.wait()
        taken = lines[other.pid].next()
        took = time.monotonic() - killed
        assert taken["event"] == "acquired", taken
        assert taken["epoch"] > epoch, (taken, epoch)
        assert took < 2.0, f"taken over after {took:.2f} s"
        say(check="taken over", after_s=round(took, 3), epoch=taken["epoch"])
        # Let the new owner's own appends land before reading.
        for _ in range(3):
            assert lines[other.pid].next()["event"] == "appended"
        records = replay(client, pb, session)
        fences = [r for r in records if r.WhichOneof("kind") == "fence"]
        fence = fences[-1]
        assert fence.epoch == taken["epoch"], fence
        assert (fence.fence.previous_seq, fence.fence.previous_epoch) == (last, epoch), fence
        assert fence.seq == last + 1, fence
        say(check="fence after the dead owner's last event", seq=fence.seq)

        # --- 3. the dead owner's epoch is refused, and its record is not in the journal
        try:
            client.Append(
                pb.AppendRequest(session=session, epoch=epoch, payloads=[b"stale"], request_id="stale")
            )
            raise AssertionError("a stale append was accepted")
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error
            why, metadata = reason(error)
            assert why in ("FENCED", "LEASE_LOST"), (why, metadata)
            say(check="stale append refused", reason=why, metadata=metadata)
        payloads = [r.event for r in replay(client, pb, session) if r.WhichOneof("kind") == "event"]
        assert b"stale" not in payloads, payloads

        # --- 4. SIGSTOP the owner: it loses the session within the keepalive timeout
        new_epoch = taken["epoch"]
        frozen = time.monotonic()
        other.send_signal(signal.SIGSTOP)
        while True:
            check = client.Validate(pb.ValidateRequest(session=session, epoch=new_epoch))
            if not check.current:
                break
            assert time.monotonic() - frozen < 8.0, "the frozen client still owns its session"
            time.sleep(0.05)
        say(check="frozen client released", after_s=round(time.monotonic() - frozen, 3))
    finally:
        for process in racers:
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.kill()
                process.wait()

    # --- 5. a retried append lands once
    import queue

    requests = queue.Queue()
    requests.put(pb.AttachRequest(acquire=pb.Acquire(session=session, wait=True, wait_ms=10000)))
    attach = client.Attach(iter(requests.get, None))
    response = next(attach)
    assert response.WhichOneof("event") == "acquired", response
    mine, token = response.acquired.epoch, response.acquired.token
    request = pb.AppendRequest(session=session, epoch=mine, token=token, payloads=[b"once"], request_id="retry-1")
    one = client.Append(request)
    two = client.Append(request)
    assert (one.first_seq, one.last_seq) == (two.first_seq, two.last_seq), (one, two)
    payloads = [r.event for r in replay(client, pb, session) if r.WhichOneof("kind") == "event"]
    assert payloads.count(b"once") == 1, payloads
    say(check="retry landed once", seq=one.first_seq)

    # --- 6. health, and a call through reflection alone
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    health = health_pb2_grpc.HealthStub(channel)
    served = health.Check(health_pb2.HealthCheckRequest(service="leasehold.v1.Leasehold"))
    assert served.status == health_pb2.HealthCheckResponse.SERVING, served
    current = reflected_validate(channel, session, mine)
    assert current, "reflection's Validate says the owner is current"
    say(check="health and reflection", serving=True)
    requests.put(pb.AttachRequest(release=pb.Release(session=session)))
    released = next(attach)
    assert released.WhichOneof("event") == "released", released
    requests.put(None)

    say(check="all", ok=True)


def reflected_validate(channel, session, epoch):
    """Validate, with its messages built from what server reflection serves: no proto file."""
    from google.protobuf import descriptor_pool, message_factory
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
        ProtoReflectionDescriptorDatabase,
    )

    database = ProtoReflectionDescriptorDatabase(channel)
    assert "leasehold.v1.Leasehold" in database.get_services()
    pool = descriptor_pool.DescriptorPool(database)
    method = pool.FindServiceByName("leasehold.v1.Leasehold").FindMethodByName("Validate")
    request_type = message_factory.GetMessageClass(method.input_type)
    response_type = message_factory.GetMessageClass(method.output_type)
    call = channel.unary_unary(
        "/leasehold.v1.Leasehold/Validate",
        request_serializer=request_type.SerializeToString,
        response_deserializer=response_type.FromString,
    )
    response = call(request_type(session=session, epoch=epoch))
    return response.current


def one_call(address):
    """One Validate and a health check, e.g. over a Unix socket (`unix:/path`)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    pb, rpc = stubs()
    # gRPC's C core sends a Unix socket's path as the :authority, which HTTP/2 servers on h2
    # (tonic's) refuse as malformed: name an authority (docs/sidecar.md).
    channel = grpc.insecure_channel(address, options=[("grpc.default_authority", "localhost")])
    answer = rpc.LeaseholdStub(channel).Validate(pb.ValidateRequest(session=str(uuid.uuid4()), epoch=1))
    assert not answer.current, answer
    served = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""))
    assert served.status == health_pb2.HealthCheckResponse.SERVING, served
    say(check="one call", address=address, ok=True)


if __name__ == "__main__":
    if sys.argv[1] == "holder":
        holder(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif sys.argv[1] == "one-call":
        one_call(sys.argv[2])
    else:
        main(sys.argv[1])
