"""A cluster in a box: Slurm and Cloud TPU commands that run the launchers' scripts on this machine.

    export PATH=$PWD/launch/localcluster/bin:$PATH SAO_LOCALCLUSTER_DIR=/tmp/box
    python launch/gpu_slurm.py ...     # sbatch, srun, scontrol ... are these shims
    squeue; sacct -j 1 -n -P -o JobID,State,ExitCode; cat /tmp/box/calls.jsonl

``bin/`` holds ``sbatch``, ``srun``, ``squeue``, ``scancel``, ``scontrol``,
``sacct`` (``slurm.py``) and ``gcloud`` (``gcloud.py``: ``compute tpus tpu-vm
create|ssh|scp|delete|describe|list`` and ``compute ssh|scp`` for fleet
machines). They EXECUTE what a launcher generates, as the real commands would
on a cluster, with the standard library only:

* a Slurm job runs its batch script with ``bash`` in the background (``sbatch``
  returns at once, ``--wait`` waits); each node is a loopback address
  (``127.0.<job>.<k>``, so that ``host:port`` addresses in the script reach the
  node's processes) with a directory ``<box>/slurm/job<id>/<node>/``;
  ``srun`` starts one task per node of the (het) group, each in its own
  process group, with ``SLURM_PROCID``, ``SLURM_NODEID``, ``SLURM_NNODES``,
  ``SLURM_JOB_NODELIST``, ``SLURMD_NODENAME``, ``TMPDIR`` (the node's ``tmp/``,
  through a short link in ``/tmp`` when its path is too long for the Unix
  sockets SGLang puts there); ``--time`` is
  enforced, ``scancel`` ends the job (SIGTERM, SIGKILL after 10 s);
* a TPU VM is a directory per host (``<box>/gcloud/tpu/<name>/w<k>/``, its
  ``$HOME``); ``ssh --worker=all`` runs the command on every host at once with
  ``TPU_WORKER_ID``, ``TPU_NAME``, ``HOSTNAME`` and the host's chips as CPU
  devices (``XLA_FLAGS=--xla_force_host_platform_device_count=<chips>``,
  ``JAX_PLATFORMS=cpu``); ``delete`` ends what still runs there; a fleet
  machine (``gcloud compute ssh NAME``) is a directory made on first use (its
  name must resolve here: use ``localhost``).

When a job's script exits, what it started has Slurm's ``KillWait`` (30 s,
``SAO_LOCALCLUSTER_KILL_WAIT_S``) to exit before it counts as a leftover.
Every call is appended to ``<box>/calls.jsonl`` (``{"tool", "argv", "cwd", "time"}``)
and so are the box's own events (``job_end`` with the exit status, ``leftover``
for processes still running when their job ended or their VM was deleted:
they are then killed). Every process the box starts carries
``SAO_LOCALCLUSTER_TAG`` (``job:<id>``, ``tpu:<name>``, ``vm:<name>``) in its
environment, inherited by its children, which is how leftovers are found
(``box.tagged``; ``SPT_NOENV=1`` is set too, so that a process calling
``setproctitle``, as SGLang's scheduler and detokenizer do, keeps its
environment readable). ``SAO_LOCALCLUSTER_DIR`` (default
``/tmp/sao-localcluster``) is the box; one box per test keeps tests apart.
Not simulated: installs from the network are run as written (launchers take
``--no_install`` and an installed ``--repo_dir`` for the box), partitions,
accounting beyond ``sacct``'s state and exit code.
"""
