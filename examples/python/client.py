"""A leasehold client in Python: own a session, append to its journal, stop on loss.

    pip install ./python          # the package, and the `leasehold` command
    leasehold --endpoints http://127.0.0.1:2379 serve --listen 127.0.0.1:50051 &
    python examples/python/client.py 127.0.0.1:50051 SESSION-UUID
"""

import sys

import leasehold


def main(address: str, session: str) -> None:
    with leasehold.connect_sync(address) as client:
        try:
            # Ownership lasts for the block; leaving it releases the session.
            with client.own(session, wait=30.0) as own:
                print(f"owner of {session} at epoch {own.epoch}, journal at {own.tip_seq}")
                for i in range(10):
                    # Each append carries the ownership's token and a request id of its own,
                    # and is retried under that id: it commits once, or raises.
                    appended = own.append(f"step {i}".encode())
                    print(f"appended step {i} at {appended.first_seq}")
        except leasehold.OwnershipEnded as lost:
            sys.exit(f"lost the session: stop acting on it ({lost})")  # the one rule
        except leasehold.Held as held:
            sys.exit(f"held by {held.holder_node or 'another owner'} at epoch {held.holder_epoch}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
