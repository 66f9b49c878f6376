"""Regenerates the sidecar's stubs, leasehold/v1/, from proto/leasehold/v1/leasehold.proto.

    python generate.py            write them
    python generate.py --check    exit 1 if the checked-in stubs differ from the proto's

Needs the ``dev`` extra (grpcio-tools and mypy-protobuf, whose protoc-gen-mypy must be on PATH).
"""

from __future__ import annotations

import filecmp
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_ROOT = os.path.join(os.path.dirname(HERE), "proto")
PROTO = os.path.join(PROTO_ROOT, "leasehold", "v1", "leasehold.proto")
STUBS = ["leasehold_pb2.py", "leasehold_pb2.pyi", "leasehold_pb2_grpc.py", "leasehold_pb2_grpc.pyi"]


def generate(out: str) -> None:
    # grpcio-tools ships no type information.
    from grpc_tools import protoc  # type: ignore[import-untyped]

    bin_dir = os.path.dirname(sys.executable)
    os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        f"--mypy_out={out}",
        f"--mypy_grpc_out={out}",
        PROTO,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")


def main() -> int:
    if sys.argv[1:] == ["--check"]:
        with tempfile.TemporaryDirectory() as out:
            generate(out)
            stale = [
                name
                for name in STUBS
                if not filecmp.cmp(
                    os.path.join(out, "leasehold", "v1", name),
                    os.path.join(HERE, "leasehold", "v1", name),
                    shallow=False,
                )
            ]
        if stale:
            print(f"stale stubs: {', '.join(stale)}; run python/generate.py", file=sys.stderr)
            return 1
        print("the stubs match the proto")
        return 0
    generate(HERE)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
