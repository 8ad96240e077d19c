"""Reads the history of an offline Weights & Biases run (``WANDB_MODE=offline``) from its
``.wandb`` file: W&B's record log (a LevelDB-style log of 32 KiB blocks, after a 7-byte
header) of ``wandb_internal_pb2.Record`` protobufs. wandb >= 0.20 has no Python reader."""
import glob
import json
import os
import struct
import time

BLOCK = 32768
HEADER = 7


def records(path: str) -> list[bytes]:
    data = open(path, "rb").read()
    pos, out, part = HEADER, [], b""
    while pos + 7 <= len(data):
        if BLOCK - pos % BLOCK < 7:  # the rest of a block too small for a header: padding
            pos += BLOCK - pos % BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        part += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):            # a full record, or the last piece of one
            out.append(part)
            part = b""
        elif kind == 0:               # zero padding to the block's end
            pos += (BLOCK - pos % BLOCK) % BLOCK
    return out


def wandb_history(workdir, timeout_s: float = 60.0) -> list[dict]:
    """Every ``run.log`` row of the one offline run under ``<workdir>/wandb``, once its
    ``exit`` record is written (wandb's service may still be flushing after ``finish()``)."""
    from wandb.proto import wandb_internal_pb2 as pb
    paths = glob.glob(os.path.join(str(workdir), "wandb", "offline-run-*", "*.wandb"))
    assert len(paths) == 1, paths
    deadline = time.monotonic() + timeout_s
    while True:
        rows, done = [], False
        for data in records(paths[0]):
            r = pb.Record()
            r.ParseFromString(data)
            kind = r.WhichOneof("record_type")
            done = done or kind == "exit"
            if kind == "history":
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item})
        if done or time.monotonic() > deadline:
            return rows
        time.sleep(0.5)
