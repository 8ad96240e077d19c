"""The program that runs inside the sandbox for one workspace command.

It is shipped as the sandbox's ``main.py`` (sao/envs/swe/workspace.py): it
reads ``sao_exec.json``, runs the command with bash in the repository copy
(``REPO_DIR``), keeps the first ``max_output`` bytes of its merged
stdout/stderr, kills the command's process group at its timeout, and prints
one frame line, ``FRAME_MARK`` + JSON, holding the return code, the output,
the files that changed or disappeared (base64) and an optional collected
file (e.g. a junit XML report). The frame is read by the host as untrusted
data: the command runs as the same uid and could forge it, which can only
set the agent's own working copy.
"""
from __future__ import annotations

FRAME_MARK = "\n@@SAO-WORKSPACE-FRAME@@"
REPO_DIR = "/tmp/repo"

SOURCE = r'''
import base64, hashlib, json, os, signal, subprocess, sys, threading, time
MARK = %(mark)r
ROOT = %(root)r
IGNORED = set(%(ignored)r)
cfg = json.load(open("/tmp/sao_exec.json"))

def snapshot():
    out = {}
    for d, dirs, names in os.walk(ROOT):
        dirs[:] = sorted(x for x in dirs if x not in IGNORED and not os.path.islink(os.path.join(d, x)))
        for n in names:
            p = os.path.join(d, n)
            if n.endswith((".pyc", ".pyo")) or os.path.islink(p) or not os.path.isfile(p):
                continue
            try:
                with open(p, "rb") as f:
                    out[os.path.relpath(p, ROOT)] = hashlib.sha256(f.read()).hexdigest()
            except OSError:
                pass
    return out

os.makedirs(ROOT, exist_ok=True)
before = snapshot()
venv_bin = os.path.dirname(sys.executable)
if not os.access(sys.executable, os.X_OK):
    # The sandbox uid cannot exec this interpreter by its path (e.g. it lives
    # under a root-only home): a throwaway venv whose python is this very
    # process's executable (/proc/PID/exe), seeing the same site-packages.
    import site
    shim = "/tmp/.sao-python"
    sp = shim + "/lib/python%%d.%%d/site-packages" %% sys.version_info[:2]
    os.makedirs(shim + "/bin", exist_ok=True)
    os.makedirs(sp, exist_ok=True)
    for name in ("python", "python3"):
        os.symlink("/proc/%%d/exe" %% os.getpid(), shim + "/bin/" + name)
    with open(shim + "/pyvenv.cfg", "w") as f:
        f.write("home = %%s/bin\ninclude-system-site-packages = false\n" %% sys.base_prefix)
    with open(sp + "/sao_site.pth", "w") as f:
        f.write("import site; list(map(site.addsitedir, %%r))\n" %% site.getsitepackages())
    with open(shim + "/bin/pytest", "w") as f:
        f.write('#!/bin/sh\nexec python -m pytest "$@"\n')
    os.chmod(shim + "/bin/pytest", 0o755)
    venv_bin = shim + "/bin"
env = {"PATH": venv_bin + ":/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8",
       "PYTHONDONTWRITEBYTECODE": "1", "PYTHONIOENCODING": "utf-8", "TERM": "dumb",
       "PAGER": "cat", "GIT_PAGER": "cat", "OMP_NUM_THREADS": "1"}
env.update(cfg.get("env") or {})
cwd = os.path.normpath(os.path.join(ROOT, cfg.get("cwd") or "."))
if not os.path.isdir(cwd):
    cwd = ROOT
stdin = open(cfg["stdin"], "rb") if cfg.get("stdin") else subprocess.DEVNULL
start = time.monotonic()
proc = subprocess.Popen(["bash", "-c", cfg["command"]], cwd=cwd, env=env, stdin=stdin,
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
buf, state = bytearray(), {"more": False}
limit = int(cfg["max_output"])

def reader():
    while True:
        chunk = proc.stdout.read1(65536)
        if not chunk:
            return
        room = limit - len(buf)
        if room > 0:
            buf.extend(chunk[:room])
        if len(chunk) > room:
            state["more"] = True

t = threading.Thread(target=reader, daemon=True)
t.start()
timed_out = False
try:
    rc = proc.wait(timeout=float(cfg["timeout"]))
except subprocess.TimeoutExpired:
    timed_out, rc = True, None
try:
    os.killpg(proc.pid, signal.SIGKILL)
except OSError:
    pass
if rc is None:
    proc.wait()
t.join(timeout=1.0)
after = snapshot()
changed, size, error = {}, 0, None
for rel, digest in sorted(after.items()):
    if before.get(rel) != digest:
        try:
            with open(os.path.join(ROOT, rel), "rb") as f:
                data = f.read()
        except OSError:
            continue
        size += len(data)
        if size > int(cfg["max_change"]):
            error = "the command changed more than %%d bytes of files; changes discarded" %% int(cfg["max_change"])
            changed = {}
            break
        changed[rel] = base64.b64encode(data).decode()
deleted = [] if error else sorted(set(before) - set(after))
collected = None
if cfg.get("collect"):
    try:
        with open(cfg["collect"], "rb") as f:
            collected = base64.b64encode(f.read(int(cfg["max_change"]))).decode()
    except OSError:
        collected = None
frame = {"returncode": rc, "timed_out": timed_out, "truncated": state["more"],
         "output": base64.b64encode(bytes(buf)).decode(), "changed": changed,
         "deleted": deleted, "error": error, "collected": collected,
         "seconds": time.monotonic() - start}
sys.stdout.write(MARK + json.dumps(frame) + "\n")
sys.stdout.flush()
'''


def source(ignored) -> str:
    """The driver's Python source (``ignored``: directory names left out of the snapshot)."""
    return SOURCE % {"mark": FRAME_MARK, "root": REPO_DIR, "ignored": sorted(ignored)}
