"""The checked-in stubs match sao.proto (regenerate: python -m sao.rpc.gen)."""
import ast
import pathlib

from google.protobuf import descriptor_pb2

from sao.rpc import gen, sao_pb2, sao_pb2_grpc

STALE = "stubs are stale: run `.venv/bin/python -m sao.rpc.gen`"


def _strip_json_names(messages) -> None:
    # protoc's descriptor set carries json_name; the embedded copy omits it.
    for m in messages:
        for f in m.field:
            f.ClearField("json_name")
        _strip_json_names(m.nested_type)


def test_message_stub_matches_proto(tmp_path):
    gen.descriptor_set(tmp_path / "set.pb")
    compiled = descriptor_pb2.FileDescriptorSet.FromString((tmp_path / "set.pb").read_bytes())
    _strip_json_names(compiled.file[-1].message_type)
    checked_in = descriptor_pb2.FileDescriptorProto.FromString(sao_pb2.DESCRIPTOR.serialized_pb)
    assert compiled.file[-1] == checked_in, STALE


def _public_defs(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and node.value.startswith("/sao.rpc."):
            names.add(node.value)
    return names


def test_grpc_stub_matches_proto(tmp_path):
    gen.generate(tmp_path)
    fresh = _public_defs(tmp_path / "sao" / "rpc" / "sao_pb2_grpc.py")
    checked_in = _public_defs(pathlib.Path(sao_pb2_grpc.__file__))
    assert fresh == checked_in, STALE
    assert {"/sao.rpc.RolloutWorker/Generate", "/sao.rpc.RolloutWorker/UpdateWeights",
            "/sao.rpc.RolloutWorker/Status"} <= checked_in
