"""The sidecar's guarantees for every client, through a client that knows no proto file.

Run by cli/tests/sidecar_python.rs: `guarantees_test.py LEASEHOLD ENDPOINT NAMESPACE`, where
LEASEHOLD is the `leasehold` binary, ENDPOINT an etcd client URL and NAMESPACE a fresh
namespace. Every message is built from what server reflection serves. It starts its own
`leasehold serve` processes (and SIGKILLs and restarts them), then checks:

1. single writer: a client that does not hold a session cannot write into it, with no Attach
   stream, with one that holds nothing, or with a made-up token; nothing it sends lands;
2. exactly once: the owner appends 1,200 records under distinct request ids, then retries the
   first: it is answered the first call's sequence numbers, and the record is there once;
3. decided by the journal: an append answered, then its sidecar SIGKILLed and started again:
   its retry is answered the first call's sequence numbers, on the restarted sidecar and on a
   second one; a request id that never landed is OUTCOME_UNKNOWN while the dead sidecar's
   lease lives, then FAILED_PRECONDITION; after a release and 1,200 junk request ids under the
   ended epoch, the owner's retry of a committed append is still answered;
4. bounds: 200 appends with a 1 MiB request id are refused INVALID_ARGUMENT and the sidecar
   does not grow; streams, sessions per stream and replays past their flags are refused
   RESOURCE_EXHAUSTED (or Failed).

Exits 0 when every check holds; prints what it saw, one JSON line per check.
"""

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid


def say(**line):
    print(json.dumps(line), flush=True)


class Sidecar:
    """A `leasehold serve` process on a loopback port of its own."""

    def __init__(self, binary, endpoint, namespace, node, *flags):
        self.args = [
            binary, "--endpoints", endpoint, "--namespace", namespace, "--node", node,
            "--ttl", "3", "--margin", "0.5", "serve", "--listen", "127.0.0.1:0",
            "--client-keepalive", "1s", *flags,
        ]
        self.start()

    def start(self):
        self.process = subprocess.Popen(
            self.args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            assert line, f"leasehold serve ended: {self.process.wait()}"
            if "serving leasehold.v1.Leasehold on " in line:
                self.address = line.split("serving leasehold.v1.Leasehold on ")[1].split(",")[0]
                # The rest of its output is not read: drain it so that it never blocks.
                threading.Thread(target=self.process.stdout.read, daemon=True).start()
                return
        raise AssertionError("leasehold serve did not serve within 30 s")

    def kill(self):
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def rss_kib(self):
        with open(f"/proc/{self.process.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        raise AssertionError("no VmRSS")

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=30)


class Reflected:
    """A client of one sidecar whose messages come from server reflection alone."""

    def __init__(self, address):
        import grpc
        from google.protobuf import descriptor_pool
        from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
            ProtoReflectionDescriptorDatabase,
        )

        self.grpc = grpc
        self.channel = grpc.insecure_channel(address)
        database = ProtoReflectionDescriptorDatabase(self.channel)
        assert "leasehold.v1.Leasehold" in database.get_services()
        self.pool = descriptor_pool.DescriptorPool(database)
        self.service = self.pool.FindServiceByName("leasehold.v1.Leasehold")

    def message(self, name, **fields):
        from google.protobuf import message_factory

        kind = message_factory.GetMessageClass(self.pool.FindMessageTypeByName(f"leasehold.v1.{name}"))
        known = kind.DESCRIPTOR.fields_by_name
        # A field the server does not know (an older sidecar) is left out.
        return kind(**{k: v for k, v in fields.items() if k in known})

    def _method(self, name):
        from google.protobuf import message_factory

        method = self.service.FindMethodByName(name)
        request = message_factory.GetMessageClass(method.input_type)
        response = message_factory.GetMessageClass(method.output_type)
        return f"/leasehold.v1.Leasehold/{name}", request, response

    def call(self, name, **fields):
        path, request, response = self._method(name)
        known = request.DESCRIPTOR.fields_by_name
        call = self.channel.unary_unary(
            path, request_serializer=request.SerializeToString, response_deserializer=response.FromString
        )
        return call(request(**{k: v for k, v in fields.items() if k in known}), timeout=30)

    def stream(self, name, **fields):
        path, request, response = self._method(name)
        call = self.channel.unary_stream(
            path, request_serializer=request.SerializeToString, response_deserializer=response.FromString
        )
        return call(request(**fields))

    def attach(self):
        return Attached(self)

    def append(self, session, epoch, token, payloads, request_id=""):
        return self.call(
            "Append", session=session, epoch=epoch, token=token, payloads=payloads, request_id=request_id
        )

    def replay(self, session):
        return [r.event for r in self.stream("Replay", session=session) if r.WhichOneof("kind") == "event"]


class Attached:
    """One Attach stream: requests in, events out."""

    def __init__(self, client):
        path, request, response = client._method("Attach")
        self.client = client
        self.requests = queue.Queue()
        call = client.channel.stream_stream(
            path, request_serializer=request.SerializeToString, response_deserializer=response.FromString
        )
        self.events = call(iter(self.requests.get, None))

    def acquire(self, session, wait=False, wait_ms=0):
        acquire = self.client.message("Acquire", session=session, wait=wait, wait_ms=wait_ms)
        self.requests.put(self.client.message("AttachRequest", acquire=acquire))
        return self.next()

    def release(self, session):
        release = self.client.message("Release", session=session)
        self.requests.put(self.client.message("AttachRequest", release=release))
        return self.next()

    def next(self):
        event = next(self.events)
        return event.WhichOneof("event"), getattr(event, event.WhichOneof("event"))

    def close(self):
        self.requests.put(None)


def refusal(error):
    """The gRPC code of a failed call, its ErrorInfo reason (or the BadRequest's field)."""
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status

    status = rpc_status.from_call(error)
    assert status is not None, f"no status details in {error}"
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            assert info.domain == "leasehold", info
            return error.code().name, info.reason, dict(info.metadata)
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            return error.code().name, "BadRequest:" + bad.field_violations[0].field, {}
    raise AssertionError(f"no ErrorInfo in {status}")


def refused(call):
    """Runs `call`, which must fail: its refusal."""
    import grpc

    try:
        answer = call()
    except grpc.RpcError as error:
        return refusal(error)
    raise AssertionError(f"accepted: {answer}")


def owned(attached, session):
    kind, event = attached.acquire(session)
    assert kind == "acquired", (kind, event)
    return event


def single_writer(sidecar):
    a, b = Reflected(sidecar.address), Reflected(sidecar.address)
    session = str(uuid.uuid4())
    holder = a.attach()
    own = owned(holder, session)
    assert len(own.token) == 16, own
    # With no Attach stream; with one that holds nothing; with a made-up token.
    idle = b.attach()
    for token in (b"", b"", os.urandom(16)):
        why = refused(lambda: b.append(session, own.epoch, token, [b"intruder"], str(uuid.uuid4())))
        assert why[:2] == ("PERMISSION_DENIED", "NOT_HOLDER"), why
        why = refused(lambda: b.append(session, own.epoch, token, [b"intruder"]))
        assert why[:2] == ("PERMISSION_DENIED", "NOT_HOLDER"), why
    mine = a.append(session, own.epoch, own.token, [b"holder's"], "h1")
    assert b.replay(session) == [b"holder's"], b.replay(session)
    idle.close()
    holder.close()
    say(check="single writer", refused="NOT_HOLDER", holder_seq=mine.first_seq)


def exactly_once(sidecar):
    client = Reflected(sidecar.address)
    session = str(uuid.uuid4())
    attached = client.attach()
    own = owned(attached, session)
    first = client.append(session, own.epoch, own.token, [b"first"], "id-0")
    for i in range(1, 1201):
        client.append(session, own.epoch, own.token, [f"e{i}".encode()], f"id-{i}")
    again = client.append(session, own.epoch, own.token, [b"first"], "id-0")
    assert (again.first_seq, again.last_seq, again.revision) == (first.first_seq, first.last_seq, first.revision), (
        first,
        again,
    )
    events = client.replay(session)
    assert events.count(b"first") == 1, events.count(b"first")
    assert len(events) == 1201, len(events)
    attached.close()
    say(check="retry after 1,200 other ids answered once", seq=again.first_seq)


def until(call, ok, within=20):
    """Calls `call` until `ok(answer_or_refusal)`; the last answer."""
    deadline = time.monotonic() + within
    while True:
        try:
            answer = call()
        except Exception as error:  # a refusal, or the sidecar not yet up
            answer = error
        if ok(answer):
            return answer
        assert time.monotonic() < deadline, f"not within {within} s: {answer}"
        time.sleep(0.2)


def decided_by_the_journal(binary, endpoint, namespace):
    first = Sidecar(binary, endpoint, namespace, "sidecar-a")
    second = Sidecar(binary, endpoint, namespace, "sidecar-b")
    try:
        client = Reflected(first.address)
        session = str(uuid.uuid4())
        attached = client.attach()
        own = owned(attached, session)
        answered = client.append(session, own.epoch, own.token, [b"committed"], "c1")

        # --- SIGKILL, start again: the retry is answered, on it and on the other sidecar
        first.kill()
        first.start()
        for address in (first.address, second.address):
            retry = Reflected(address)
            again = until(
                lambda: retry.append(session, own.epoch, own.token, [b"committed"], "c1"),
                lambda answer: not isinstance(answer, Exception)
                or refusal(answer)[0] not in ("UNAVAILABLE", "UNKNOWN"),
            )
            assert not isinstance(again, Exception), refusal(again)
            assert (again.first_seq, again.revision) == (answered.first_seq, answered.revision), (answered, again)
        # A request id that never landed: unknown while the dead sidecar's lease lives,
        # then refused for good once it is gone.
        retry = Reflected(second.address)
        never = lambda: retry.append(session, own.epoch, own.token, [b"never"], "n1")
        while_owned = refused(never)
        gone = until(never, lambda answer: isinstance(answer, Exception) and refusal(answer)[0] != "UNAVAILABLE")
        assert refusal(gone)[0] == "FAILED_PRECONDITION", refusal(gone)
        say(
            check="a committed append retried after SIGKILL and restart is answered",
            seq=again.first_seq,
            never_while_owned=while_owned[1],
            never_after=refusal(gone)[1],
        )

        # --- released, then 1,200 junk request ids under the ended epoch: still answered
        client = Reflected(second.address)
        session = str(uuid.uuid4())
        attached = client.attach()
        own = owned(attached, session)
        answered = client.append(session, own.epoch, own.token, [b"kept"], "k1")
        kind, _ = attached.release(session)
        assert kind == "released", kind
        junk = Reflected(first.address)
        for i in range(1200):
            why = refused(lambda: junk.append(session, own.epoch, os.urandom(16), [b"junk"], f"junk-{i}"))
            assert why[0] == "FAILED_PRECONDITION", why
        again = client.append(session, own.epoch, own.token, [b"kept"], "k1")
        assert (again.first_seq, again.revision) == (answered.first_seq, answered.revision), (answered, again)
        assert client.replay(session) == [b"kept"], client.replay(session)
        attached.close()
        say(check="after a release and 1,200 junk ids the owner's retry is answered", seq=again.first_seq)
    finally:
        first.stop()
        second.stop()


def bounds(binary, endpoint, namespace):
    sidecar = Sidecar(
        binary, endpoint, namespace, "sidecar-bounds",
        "--max-streams", "3", "--max-sessions-per-stream", "2", "--max-replays", "1",
    )
    try:
        client = Reflected(sidecar.address)
        session = str(uuid.uuid4())
        attached = client.attach()
        own = owned(attached, session)
        before = sidecar.rss_kib()
        huge = "x" * (1 << 20)
        for _ in range(200):
            why = refused(lambda: client.append(session, own.epoch, own.token, [b"x"], huge))
            assert why[:2] == ("INVALID_ARGUMENT", "BadRequest:request_id"), why
        grown = sidecar.rss_kib() - before
        assert grown < 64 * 1024, f"grew {grown} KiB"
        # Sessions per stream: the third acquisition fails.
        owned(attached, str(uuid.uuid4()))
        kind, failed = attached.acquire(str(uuid.uuid4()))
        assert (kind, failed.reason) == ("failed", "TOO_MANY_SESSIONS"), (kind, failed)
        # Streams: two more fit, the fourth is refused.
        more = [client.attach() for _ in range(2)]
        for stream in more:
            owned(stream, str(uuid.uuid4()))
        fourth = client.attach()
        try:
            fourth.acquire(str(uuid.uuid4()))
            raise AssertionError("a fourth stream was served")
        except client.grpc.RpcError as error:
            why = refusal(error)
            assert why[:2] == ("RESOURCE_EXHAUSTED", "TOO_MANY_STREAMS"), why
        # Replays: one follows; the second is refused.
        client.append(session, own.epoch, own.token, [b"an event"], "e1")
        follow = client.stream("Replay", session=session, follow=True)
        next(follow)
        try:
            list(client.stream("Replay", session=session))
            raise AssertionError("a second replay was served")
        except client.grpc.RpcError as error:
            why = refusal(error)
            assert why[:2] == ("RESOURCE_EXHAUSTED", "TOO_MANY_REPLAYS"), why
        follow.cancel()
        say(check="bounds", rss_growth_kib=grown, refused=["request_id", "TOO_MANY_SESSIONS", "TOO_MANY_STREAMS", "TOO_MANY_REPLAYS"])
        for stream in [attached, *more, fourth]:
            stream.close()
    finally:
        sidecar.stop()


def main(binary, endpoint, namespace):
    sidecar = Sidecar(binary, endpoint, namespace, "sidecar-main")
    try:
        single_writer(sidecar)
        exactly_once(sidecar)
    finally:
        sidecar.stop()
    decided_by_the_journal(binary, endpoint, namespace)
    bounds(binary, endpoint, namespace)
    say(check="all", ok=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
