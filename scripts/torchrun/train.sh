#!/usr/bin/env bash
# train.sh -- multi-node DDP without Slurm (cloud VMs, bare-metal machines): run the same line on every machine,
# from the repository root, on a filesystem all the machines share (every rank reads the run dir's checkpoint when
# it resumes):
#
#   NODES=2 PROCS_PER_NODE=2 ENDPOINT=host1:29400 RUN_ID=mnist-1 scripts/torchrun/train.sh experiment=mnist_slurm
#
# ENDPOINT is host:port of one of the machines (any free port), the same on all. torchrun's rendezvous there gathers
# NODES machines, numbers them and starts PROCS_PER_NODE processes on each: one DDP run, which writes into
# outputs/torchrun-<RUN_ID>/ (RUN_ID names the run: the same on all machines, a new one for each run; with NODES=1
# the run dir is the usual outputs/<date>/<time>, which restarts find but a second launch does not). Every
# argument is a Hydra override for `python -m project.train` (or PROJECT_MODULE=project.optional.reference.ddp: the
# raw-PyTorch path, which reads the same overrides). `trainer=fsdp` among them makes it one sharded (FSDP2) run
# instead, the last `trainer=` winning (PROJECT_MODULE=project.optional.reference.fsdp for its raw path).
#
# When a process dies, torchrun restarts every machine's processes (up to MAX_RESTARTS times) and the run resumes
# from its run dir's checkpoints/last.ckpt; running the same line again with the same RUN_ID resumes it likewise.
# A machine that does not join within TIMEOUT seconds, an ENDPOINT no machine serves, or one that another program
# holds, ends the launch on the others with one `error:` line within TIMEOUT (project/optional/torchrun/launcher.py).
set -euo pipefail

: "${NODES:?set NODES, the number of machines}" "${ENDPOINT:?set ENDPOINT=host:port of one machine}"
: "${RUN_ID:?set RUN_ID, a name for this run (the same on every machine)}"
# Processes per machine, one per device (GPUs; on CPU-only machines, a few processes share the cores).
PROCS_PER_NODE=${PROCS_PER_NODE:-1}
# How often torchrun restarts the processes after one fails, before the launch fails.
MAX_RESTARTS=${MAX_RESTARTS:-3}
# Seconds to wait for every machine to join (and for the ENDPOINT to answer) before ending in one line.
TIMEOUT=${TIMEOUT:-300}
# The Python that has the project installed, and the entry point it runs.
PYTHON=${PROJECT_PYTHON:-.venv/bin/python}
MODULE=${PROJECT_MODULE:-project.train}

echo "torchrun run $RUN_ID: $NODES node(s) x $PROCS_PER_NODE process(es), rendezvous $ENDPOINT, on $(hostname)"
exec "$PYTHON" -m project.optional.torchrun.launcher --nnodes="$NODES" --nproc-per-node="$PROCS_PER_NODE" \
    --rdzv-backend=c10d --rdzv-endpoint="$ENDPOINT" --rdzv-id="$RUN_ID" \
    --rdzv-conf="join_timeout=$TIMEOUT,read_timeout=$TIMEOUT" --max-restarts="$MAX_RESTARTS" \
    -m "$MODULE" trainer=ddp trainer.num_nodes="$NODES" trainer.devices="$PROCS_PER_NODE" "$@"
