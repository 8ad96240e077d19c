"""``gcloud`` in the box: TPU VMs and fleet machines as directories and process groups (package doc).

    gcloud.py compute tpus tpu-vm create NAME --zone=Z --accelerator-type=v5p-8 --version=V
    gcloud.py compute tpus tpu-vm ssh NAME --zone=Z --worker=all --command=CMD
    gcloud.py compute tpus tpu-vm scp FILE... NAME:DEST --zone=Z --worker=all
    gcloud.py compute tpus tpu-vm delete NAME --zone=Z --quiet
    gcloud.py compute tpus tpu-vm describe|list ...
    gcloud.py compute ssh MACHINE --zone=Z --command=CMD
    gcloud.py compute scp FILE... MACHINE:DEST --zone=Z
"""
from __future__ import annotations

import json
import os
import shutil
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from launch.localcluster import box  # noqa: E402
from launch.tpu_slice import chips_per_host, num_hosts  # noqa: E402

FLAGS = ("--zone", "--project", "--accelerator-type", "--version", "--worker", "--command",
         "--quiet", "--recurse", "--format", "--internal-ip", "--tunnel-through-iap")


def parse(words: list[str]) -> tuple[list[str], dict]:
    """Positional words and ``--flag[=value]`` flags (unknown flags exit)."""
    pos, flags = [], {}
    for w in words:
        if w.startswith("--"):
            name, sep, value = w.partition("=")
            if name not in FLAGS:
                box.fail("gcloud", f"flag {name} is not simulated")
            flags[name] = value if sep else True
        else:
            pos.append(w)
    return pos, flags


def tpu_dir(name: str) -> str:
    return os.path.join(box.root(), "gcloud", "tpu", name)


def vm_dir(name: str) -> str:
    """A fleet machine's home, made on first use (the launchers do not create them)."""
    path = os.path.join(box.root(), "gcloud", "vm", name)
    if not os.path.isdir(path):
        os.makedirs(path)
        box.log("box", [], event="vm_first_use", machine=name)
    return path


def tpu(name: str) -> dict:
    path = os.path.join(tpu_dir(name), "tpu.json")
    if not os.path.exists(path):
        box.fail("gcloud", f"ERROR: (gcloud.compute.tpus.tpu-vm) NOT_FOUND: TPU {name} does not exist")
    return box.read_json(path)


def hosts(rec: dict, worker) -> list[int]:
    if worker in (None, True):
        return [0]
    if worker == "all":
        return list(range(rec["hosts"]))
    picked = [int(w) for w in str(worker).split(",")]
    if any(not 0 <= w < rec["hosts"] for w in picked):
        box.fail("gcloud", f"--worker={worker}: TPU {rec['name']} has {rec['hosts']} hosts")
    return picked


def create(name: str, flags: dict) -> int:
    if os.path.exists(os.path.join(tpu_dir(name), "tpu.json")):
        box.fail("gcloud", f"ERROR: ALREADY_EXISTS: TPU {name}")
    accelerator = flags.get("--accelerator-type")
    if not isinstance(accelerator, str) or not flags.get("--version"):
        box.fail("gcloud", "create needs --accelerator-type and --version")
    rec = {"name": name, "zone": flags.get("--zone"), "accelerator": accelerator,
           "version": flags["--version"], "hosts": num_hosts(accelerator),
           "chips_per_host": chips_per_host(accelerator)}
    for k in range(rec["hosts"]):
        os.makedirs(os.path.join(tpu_dir(name), f"w{k}"), exist_ok=True)
    box.write_json(os.path.join(tpu_dir(name), "tpu.json"), rec)
    return 0


def ssh_tpu(name: str, flags: dict) -> int:
    rec = tpu(name)
    command = flags.get("--command")
    if not isinstance(command, str):
        box.fail("gcloud", "ssh without --command (interactive) is not simulated")
    tasks = box.Tasks()
    for k in hosts(rec, flags.get("--worker")):
        home = os.path.join(tpu_dir(name), f"w{k}")
        env = box.env_for(f"tpu:{name}", HOME=home, TPU_NAME=name, TPU_WORKER_ID=k,
                          HOSTNAME=f"{name}-w-{k}", TPU_ACCELERATOR_TYPE=rec["accelerator"],
                          JAX_PLATFORMS="cpu",
                          XLA_FLAGS=f"--xla_force_host_platform_device_count={rec['chips_per_host']}")
        tasks.start(["bash", "-c", command], env, home)
    return tasks.wait()


def ssh_vm(name: str, flags: dict) -> int:
    home = vm_dir(name)
    command = flags.get("--command")
    if not isinstance(command, str):
        box.fail("gcloud", "ssh without --command (interactive) is not simulated")
    tasks = box.Tasks()
    tasks.start(["bash", "-c", command], box.env_for(f"vm:{name}", HOME=home, HOSTNAME=name), home)
    return tasks.wait()


def scp(pos: list[str], flags: dict, tpu_name_dirs) -> int:
    """``scp SRC... HOST:DEST``: copies local files into each host's home."""
    if len(pos) < 2 or ":" not in pos[-1]:
        box.fail("gcloud", "scp SRC... HOST:DEST (local to remote only is simulated)")
    host, _, dest = pos[-1].partition(":")
    for home in tpu_name_dirs(host):
        target = os.path.join(home, dest)
        for src in pos[:-1]:
            if os.path.isdir(src):
                if flags.get("--recurse") is not True:
                    box.fail("gcloud", f"{src} is a directory (--recurse)")
                shutil.copytree(src, os.path.join(target, os.path.basename(src)), dirs_exist_ok=True)
            else:
                shutil.copy(src, target if not dest.endswith("/") else
                            os.path.join(target, os.path.basename(src)))
    return 0


def delete(name: str) -> int:
    tpu(name)
    box.end_tagged(f"tpu:{name}", f"TPU {name} deleted", grace_s=0.0)
    shutil.rmtree(tpu_dir(name))
    return 0


def main(argv: list[str]) -> int:
    box.log("gcloud", argv)
    pos, flags = parse(argv)
    if pos[:4] == ["compute", "tpus", "tpu-vm", "list"]:
        base = os.path.dirname(tpu_dir("x"))
        for name in sorted(os.listdir(base)) if os.path.isdir(base) else []:
            print(name)
        return 0
    if pos[:3] == ["compute", "tpus", "tpu-vm"] and len(pos) >= 5:
        verb, name = pos[3], pos[4]
        if verb == "create":
            return create(name, flags)
        if verb == "describe":
            print(json.dumps(tpu(name), indent=1))
            return 0
        if verb == "ssh":
            return ssh_tpu(name, flags)
        if verb == "delete":
            return delete(name)
        if verb == "scp":
            return scp(pos[4:], flags, lambda host: [os.path.join(tpu_dir(host), f"w{k}")
                                                     for k in hosts(tpu(host), flags.get("--worker"))])
    if pos[:2] == ["compute", "ssh"] and len(pos) == 3:
        return ssh_vm(pos[2], flags)
    if pos[:2] == ["compute", "scp"]:
        return scp(pos[2:], flags, lambda host: [vm_dir(host)])
    box.fail("gcloud", f"not simulated: gcloud {' '.join(argv)}", 2)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
