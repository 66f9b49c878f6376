"""A leasehold client in Python: own a session, append to its journal, stop on loss.

    python -m grpc_tools.protoc -I proto --python_out=. --grpc_python_out=. \
        proto/leasehold/v1/leasehold.proto
    PYTHONPATH=. python examples/python/client.py 127.0.0.1:50051 SESSION-UUID
"""
import queue
import sys
import threading
import uuid

import grpc
from leasehold.v1 import leasehold_pb2 as pb, leasehold_pb2_grpc as rpc

address, session = sys.argv[1], sys.argv[2]
client = rpc.LeaseholdStub(grpc.insecure_channel(address))
requests = queue.Queue()
requests.put(pb.AttachRequest(acquire=pb.Acquire(session=session, wait=True)))
events = client.Attach(iter(requests.get, None))  # ownership lasts as long as this stream

acquired = next(events)
assert acquired.WhichOneof("event") == "acquired", acquired
# The epoch is public; the token is this stream's alone: it is what lets it write.
epoch, token = acquired.acquired.epoch, acquired.acquired.token
print(f"owner of {session} at epoch {epoch}, journal at {acquired.acquired.tip_seq}")
lost = threading.Event()
threading.Thread(target=lambda: (next(events, None), lost.set()), daemon=True).start()

for i in range(10):
    if lost.is_set():
        sys.exit("lost the session: stop acting on it")  # the one rule
    request = pb.AppendRequest(session=session, epoch=epoch, token=token,
                               payloads=[f"step {i}".encode()], request_id=str(uuid.uuid4()))
    try:
        appended = client.Append(request)  # on UNAVAILABLE, resend the same request
    except grpc.RpcError as error:
        sys.exit(f"append refused: {error.code()} {error.details()}")  # FAILED_PRECONDITION: stop
    print(f"appended step {i} at {appended.first_seq}")

requests.put(pb.AttachRequest(release=pb.Release(session=session)))
requests.put(None)
