"""Slurm in the box: ``sbatch``, ``srun``, ``squeue``, ``scancel``, ``scontrol``, ``sacct`` (package doc).

    slurm.py sbatch [--wait] [--parsable] [#SBATCH options] SCRIPT
"""
from __future__ import annotations

import hashlib
import os
import re
import shlex
import signal
import subprocess
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from launch.localcluster import box  # noqa: E402

# Options the box understands (others are refused, so that nothing is silently ignored).
VALUE_OPTS = {"--job-name": "name", "-J": "name", "--time": "time", "-t": "time", "--nodes": "nodes",
              "-N": "nodes", "--output": "output", "-o": "output", "--error": "error", "-e": "error",
              "--gpus-per-node": None, "--ntasks-per-node": None, "--cpus-per-task": None,
              "--partition": None, "-p": None, "--account": None, "-A": None, "--mem": None,
              "--exclusive": None}


KILL_WAIT_ENV = "SAO_LOCALCLUSTER_KILL_WAIT_S"  # slurm.conf's KillWait, in seconds (default 30)


def job_dir(job_id: int | str) -> str:
    return os.path.join(box.root(), "slurm", f"job{job_id}")


def node_tmp(job_id: int | str, node: str) -> str:
    """The node's ``TMPDIR``: ``<job dir>/<node>/tmp``, reached through a short link in
    ``/tmp`` (made here) when that path is long. Programs put Unix sockets there (SGLang's
    ZMQ IPC endpoints), whose paths may not exceed 107 bytes: under pytest's deep
    temporary directories a real SGLang server could not start."""
    real = os.path.join(job_dir(job_id), node, "tmp")
    os.makedirs(real, exist_ok=True)
    link = _tmp_link(real)
    if link == real:
        return real
    if os.path.realpath(link) != os.path.realpath(real):
        if os.path.islink(link):
            os.remove(link)
        os.symlink(real, link)
    return link


def _tmp_link(real: str) -> str:
    """Where ``node_tmp`` points ``TMPDIR`` for the directory ``real`` (itself when short)."""
    if len(real) <= 48:
        return real
    return os.path.join("/tmp", "sao-box-" + hashlib.sha1(real.encode()).hexdigest()[:16])


def job_record(job_id) -> dict:
    path = os.path.join(job_dir(job_id), "job.json")
    if not os.path.exists(path):
        box.fail("slurm", f"no job {job_id}")
    return box.read_json(path)


def parse_options(words: list[str], opts: dict) -> list[str]:
    """Reads ``--opt=value`` / ``--opt value`` words into ``opts``; returns the rest
    (from the first word that is not an option). Exits on an unknown option."""
    i = 0
    while i < len(words):
        w = words[i]
        if not w.startswith("-"):
            return words[i:]
        name, sep, value = w.partition("=")
        if name not in VALUE_OPTS:
            box.fail("sbatch", f"option {name} is not simulated")
        if name == "--exclusive":
            i += 1
            continue
        if not sep:
            i += 1
            value = words[i]
        if VALUE_OPTS[name]:
            opts[VALUE_OPTS[name]] = value
        i += 1
    return []


def parse_script(text: str) -> tuple[dict, list[int]]:
    """``#SBATCH`` lines before the first command: ``(options, nodes per het group)``."""
    opts, groups, group = {}, [], {}
    for line in text.splitlines()[1:]:
        if not line.strip() or (line.startswith("#") and not line.startswith("#SBATCH")):
            continue
        if not line.startswith("#SBATCH"):
            break
        words = shlex.split(line[len("#SBATCH"):])
        if words in (["hetjob"], ["packjob"]):
            groups.append(int(group.get("nodes", 1)))
            group = {}
            continue
        parse_options(words, group)
        opts.update({k: v for k, v in group.items() if k != "nodes"})
    groups.append(int(group.get("nodes", 1)))
    return opts, groups


def seconds(limit: str) -> float:
    """Slurm time: ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH[:MM[:SS]]``."""
    days, _, rest = limit.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if len(parts) == 1:
        s = parts[0] * 60 if not days else parts[0] * 3600
    elif len(parts) == 2:
        s = parts[0] * 60 + parts[1] if not days else parts[0] * 3600 + parts[1] * 60
    else:
        s = parts[0] * 3600 + parts[1] * 60 + parts[2]
    return s + int(days or 0) * 86400


def node_name(job_id: int, k: int) -> str:
    """Node ``k`` of job ``job_id``: a loopback address of its own."""
    return f"127.{1 + job_id // 250 % 250}.{job_id % 250}.{k + 1}"


def sbatch(argv: list[str]) -> int:
    wait = "--wait" in argv or "-W" in argv
    parsable = "--parsable" in argv
    cli = {}
    rest = parse_options([a for a in argv if a not in ("--wait", "-W", "--parsable")], cli)
    if not rest:
        box.fail("sbatch", "usage: sbatch [options] SCRIPT")
    script = os.path.abspath(rest[0])
    with open(script) as f:
        opts, groups = parse_script(f.read())
    opts.update(cli)
    job_id = box.next_id("slurm_next_id")
    names, k = [], 0
    for n in groups:
        names.append([node_name(job_id, k + i) for i in range(n)])
        k += n
    output = opts.get("output", "slurm-%j.out").replace("%j", str(job_id)).replace(
        "%x", opts.get("name", "sbatch"))
    record = {"id": job_id, "name": opts.get("name", os.path.basename(script)), "groups": names,
              "script": script, "args": rest[1:], "cwd": os.getcwd(),
              "output": os.path.join(os.getcwd(), output), "state": "PENDING", "exit_code": None,
              "time_limit_s": seconds(opts["time"]) if "time" in opts else None}
    os.makedirs(job_dir(job_id), exist_ok=True)
    for node in sum(names, []):
        node_tmp(job_id, node)
    box.write_json(os.path.join(job_dir(job_id), "job.json"), record)
    runner = subprocess.Popen([sys.executable, os.path.abspath(__file__), "_job", str(job_id)],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=open(os.path.join(job_dir(job_id), "runner.err"), "ab"),
                              start_new_session=True, env=box.env_for(f"runner:{job_id}"))
    print(job_id if parsable else f"Submitted batch job {job_id}", flush=True)
    if not wait:
        return 0
    runner.wait()
    return int(job_record(job_id)["exit_code"] or 0)


def run_job(job_id: int) -> None:
    """The job's life (detached from ``sbatch``): the batch script on the first node."""
    path = os.path.join(job_dir(job_id), "job.json")
    rec = box.read_json(path)
    groups = rec["groups"]
    first = groups[0][0]
    env = box.env_for(f"job:{job_id}", SLURM_JOB_ID=job_id, SLURM_JOBID=job_id,
                      SLURM_JOB_NAME=rec["name"], SLURM_SUBMIT_DIR=rec["cwd"],
                      SLURM_JOB_NODELIST=",".join(sum(groups, [])),
                      SLURM_NNODES=len(groups[0]), SLURMD_NODENAME=first, HOSTNAME=first,
                      TMPDIR=node_tmp(job_id, first))
    if len(groups) > 1:
        env["SLURM_HET_SIZE"] = str(len(groups))
        for g, nodes in enumerate(groups):
            env[f"SLURM_JOB_NODELIST_HET_GROUP_{g}"] = ",".join(nodes)
            env[f"SLURM_NNODES_HET_GROUP_{g}"] = str(len(nodes))
    rec.update(state="RUNNING", runner_pid=os.getpid(), start_time=time.time())
    box.write_json(path, rec)
    ended = {"state": None}

    def cancel(sig, _frame):
        ended["state"] = "CANCELLED"
    signal.signal(signal.SIGTERM, cancel)
    with open(rec["output"], "ab") as out:
        proc = subprocess.Popen(["bash", rec["script"], *rec["args"]], cwd=rec["cwd"], env=env,
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                preexec_fn=os.setpgrp)
        deadline = time.monotonic() + rec["time_limit_s"] if rec["time_limit_s"] else None
        while proc.poll() is None:
            if ended["state"] is None and deadline and time.monotonic() > deadline:
                ended["state"] = "TIMEOUT"
            if ended["state"]:  # scancel or the time limit: every process of the job
                box.kill(list(box.tagged(box.root(), f"job:{job_id}")), tag=f"job:{job_id}")
                break
            time.sleep(0.2)
        code = proc.wait()
    code = 128 - code if code < 0 else code
    # Like Slurm's KillWait (30 s by default): processes the job stopped may take that long
    # to exit (an SGLang server needs > 5 s after SIGTERM); any alive after it is a leftover.
    left = box.end_tagged(f"job:{job_id}", f"job {job_id} ended",
                          grace_s=float(os.environ.get(KILL_WAIT_ENV) or 30.0))
    state = ended["state"] or ("COMPLETED" if code == 0 else "FAILED")
    for node in sum(groups, []):           # the short TMPDIR links; the directories stay
        link = _tmp_link(os.path.join(job_dir(job_id), node, "tmp"))
        if os.path.islink(link):
            os.remove(link)
    rec.update(state=state, exit_code=code, end_time=time.time(), leftover=sorted(left.values()))
    box.write_json(path, rec)
    box.log("box", [], event="job_end", job=job_id, state=state, exit_code=code)


def srun(argv: list[str]) -> int:
    job_id = os.environ.get("SLURM_JOB_ID")
    if not job_id:
        box.fail("srun", "not inside a job (no SLURM_JOB_ID)")
    rec = job_record(job_id)
    group, nodes_wanted, ntasks, kill_bad, i = 0, None, None, False, 0
    while i < len(argv) and argv[i].startswith("-"):
        name, sep, value = argv[i].partition("=")
        if name in ("--het-group", "--nodes", "-N", "--ntasks", "-n") and not sep:
            i += 1
            value = argv[i]
        if name == "--het-group":
            group = int(value)
        elif name in ("--nodes", "-N"):
            nodes_wanted = int(value)
        elif name in ("--ntasks", "-n"):
            ntasks = int(value)
        elif name in ("--kill-on-bad-exit", "-K"):
            kill_bad = value != "0"
        elif name not in ("--overlap", "--ntasks-per-node", "--label", "-l"):
            box.fail("srun", f"option {argv[i]} is not simulated")
        i += 1
    command = argv[i:]
    if not command:
        box.fail("srun", "no command")
    nodes = rec["groups"][group]
    nodes = nodes[:nodes_wanted or len(nodes)][:ntasks or len(nodes)]
    tasks = box.Tasks(kill_on_bad_exit=kill_bad)
    for k, node in enumerate(nodes):
        tmp = node_tmp(job_id, node)
        env = {**os.environ, "SLURM_PROCID": str(k), "SLURM_NODEID": str(k), "SLURM_LOCALID": "0",
               "SLURM_NNODES": str(len(nodes)), "SLURM_NTASKS": str(len(nodes)),
               "SLURM_JOB_NODELIST": ",".join(nodes), "SLURM_STEP_NODELIST": ",".join(nodes),
               "SLURM_JOB_NUM_NODES": str(len(nodes)), "SLURM_STEP_NUM_NODES": str(len(nodes)),
               "SLURMD_NODENAME": node, "HOSTNAME": node,
               "TMPDIR": tmp, "SAO_LOCALCLUSTER_NODE_DIR": os.path.join(job_dir(job_id), node)}
        tasks.start(command, env, os.getcwd())
    return tasks.wait()


def running_jobs() -> list[dict]:
    base = os.path.join(box.root(), "slurm")
    out = []
    for name in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        path = os.path.join(base, name, "job.json")
        if os.path.exists(path):
            rec = box.read_json(path)
            if rec["state"] in ("PENDING", "RUNNING"):
                out.append(rec)
    return out


def squeue(argv: list[str]) -> int:
    header = not ({"-h", "--noheader"} & set(argv))
    ids = None
    for j, a in enumerate(argv):
        if a in ("-j", "--jobs"):
            ids = set(argv[j + 1].split(","))
        elif a.startswith("--jobs="):
            ids = set(a.split("=", 1)[1].split(","))
    if header:
        print(f"{'JOBID':>8} {'NAME':>12} {'ST':>3} {'NODES':>5} NODELIST")
    for rec in running_jobs():
        if ids is None or str(rec["id"]) in ids:
            nodes = sum(rec["groups"], [])
            print(f"{rec['id']:>8} {rec['name'][:12]:>12} {'R' if rec['state'] == 'RUNNING' else 'PD':>3} "
                  f"{len(nodes):>5} {','.join(nodes)}")
    return 0


def scancel(argv: list[str]) -> int:
    for job_id in [a for a in argv if not a.startswith("-")]:
        rec = job_record(job_id)
        if rec["state"] == "RUNNING" and rec.get("runner_pid"):
            os.kill(rec["runner_pid"], signal.SIGTERM)
    return 0


def expand_hostlist(text: str) -> list[str]:
    """``a,b[1-3,5]`` -> ``a, b1, b2, b3, b5`` (what ``scontrol show hostnames`` prints)."""
    out = []
    for m in re.finditer(r"([^,\[]+)(?:\[([^\]]+)\])?", text):
        prefix, ranges = m.group(1), m.group(2)
        if not ranges:
            out.append(prefix)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            out += [f"{prefix}{i:0{len(lo)}d}" for i in range(int(lo), int(hi or lo) + 1)]
    return out


def scontrol(argv: list[str]) -> int:
    if argv[:2] == ["show", "hostnames"]:
        text = argv[2] if len(argv) > 2 else os.environ.get("SLURM_JOB_NODELIST", "")
        print("\n".join(expand_hostlist(text)))
        return 0
    if argv[:2] == ["show", "job"] and len(argv) > 2:
        rec = job_record(argv[2])
        print(f"JobId={rec['id']} JobName={rec['name']} JobState={rec['state']} "
              f"ExitCode={rec['exit_code'] or 0}:0 NodeList={','.join(sum(rec['groups'], []))}")
        return 0
    box.fail("scontrol", f"not simulated: {' '.join(argv)}")


def sacct(argv: list[str]) -> int:
    ids, fields, header, sep = [], ["JobID", "JobName", "State", "ExitCode"], True, None
    for j, a in enumerate(argv):
        if a in ("-j", "--jobs"):
            ids = argv[j + 1].split(",")
        elif a.startswith("--jobs="):
            ids = a.split("=", 1)[1].split(",")
        elif a in ("-o", "--format"):
            fields = argv[j + 1].split(",")
        elif a.startswith("--format="):
            fields = a.split("=", 1)[1].split(",")
        elif a in ("-n", "--noheader"):
            header = False
        elif a in ("-P", "--parsable2"):
            sep = "|"
    values = {"jobid": lambda r: str(r["id"]), "jobname": lambda r: r["name"],
              "state": lambda r: r["state"], "exitcode": lambda r: f"{r['exit_code'] or 0}:0"}
    rows = [fields] if header else []
    for job_id in ids:
        rec = job_record(job_id)
        rows.append([values[f.lower()](rec) for f in fields])
    for row in rows:
        print((sep or " ").join(row if sep else (f"{v:>12}" for v in row)))
    return 0


COMMANDS = {"sbatch": sbatch, "srun": srun, "squeue": squeue, "scancel": scancel,
            "scontrol": scontrol, "sacct": sacct}


def main(argv: list[str]) -> int:
    if argv[0] == "_job":
        run_job(int(argv[1]))
        return 0
    if argv[0] not in COMMANDS:
        box.fail("slurm", f"unknown command {argv[0]}")
    box.log(argv[0], argv[1:], slurm_job=os.environ.get("SLURM_JOB_ID"))
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
