"""Regenerate fleetrl_pb2.py, its type stub fleetrl_pb2.pyi and fleetrl_pb2_grpc.py from fleetrl.proto.

Run `python -m foundation.proto.generate` from the repository root after editing the .proto.
`generated_sources()` is what tests/test_proto.py compares against the committed files.
"""

from __future__ import annotations

import pathlib
import tempfile

from grpc_tools import protoc

PROTO_DIR = pathlib.Path(__file__).resolve().parent
REPO_ROOT = PROTO_DIR.parent.parent
PROTO_REL = "foundation/proto/fleetrl.proto"
OUTPUTS = ("fleetrl_pb2.py", "fleetrl_pb2.pyi", "fleetrl_pb2_grpc.py")


def generated_sources() -> dict[str, str]:
    """Generate into a temporary directory and return {file name: source text}."""
    with tempfile.TemporaryDirectory() as out:
        rc = protoc.main(
            [
                "protoc",
                f"-I{REPO_ROOT}",
                f"--python_out={out}",
                f"--pyi_out={out}",
                f"--grpc_python_out={out}",
                PROTO_REL,
            ]
        )
        if rc != 0:
            raise RuntimeError(f"protoc failed with exit code {rc} on {PROTO_REL}")
        gen = pathlib.Path(out) / "foundation" / "proto"
        return {name: (gen / name).read_text() for name in OUTPUTS}


def main() -> None:
    for name, text in generated_sources().items():
        (PROTO_DIR / name).write_text(text)
        print(f"wrote {PROTO_DIR / name}")


if __name__ == "__main__":
    main()
