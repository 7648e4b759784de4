# Shared by the job scripts in this folder: source it from the repository root (sbatch runs a copy of the
# job script, so the scripts find this file through SLURM_SUBMIT_DIR: submit from the repository root).
# shellcheck shell=bash

# The master port Ignite derives for srun-started tasks (15000 + the job id's last 4 digits); the torchrun
# scripts use the same, so two jobs on one head node do not collide and a requeued job keeps its port.
job_master_port() {
  echo $((15000 + SLURM_JOB_ID % 10000))
}

# The node's local disk: Slurm's per-job folder where the cluster provides one, else one under /tmp.
node_local_dir() {
  echo "${SLURM_TMPDIR:-/tmp/${USER:-job}-$SLURM_JOB_ID}"
}

# Copy the dataset (a folder holding cifar-10-batches-py or cifar-10-python.tar.gz) to node-local disk on
# every node of the job, once per node; print the local folder to pass as --data_path.
stage_dataset() {
  local source=$1
  local target
  target="$(node_local_dir)/cifar10"
  # shellcheck disable=SC2016  # $1 and $2 are the inner shell's arguments
  srun --ntasks="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 --cpus-per-task=1 \
    bash -c 'mkdir -p "$2" && cp -r "$1"/. "$2"/' stage "$source" "$target" >&2
  echo "$target"
}

# Run the training step in the background so that this shell can take the warning signal (USR1, sent by
# `#SBATCH --signal=B:USR1@180` before the time limit; set WARNING_SIGNAL to the one your --signal names):
# forward SIGTERM to the tasks (every process saves a checkpoint at its next iteration and exits with code
# 75), wait for them, then requeue the job; the requeued job continues from that checkpoint (--resume_from=auto
# with a run_name fixed per job id). A preemption needs nothing from here: Slurm sends SIGTERM to the tasks
# itself and requeues a --requeue job (a cluster that announces preemption with another signal: set
# CIFAR10_DIST_PREEMPTION_SIGNALS, e.g. SIGTERM,SIGUSR2).
run_step() {
  "$@" &
  step_pid=$!
  trap stop_and_requeue "${WARNING_SIGNAL:-USR1}"
  wait "$step_pid"
  local status=$?
  trap - "${WARNING_SIGNAL:-USR1}"
  return "$status"
}

# The id to requeue: an array task's own (ARRAYJOB_TASK), so that only this task goes back to the queue.
job_to_requeue() {
  if [ -n "${SLURM_ARRAY_JOB_ID:-}" ]; then
    echo "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"
  else
    echo "$SLURM_JOB_ID"
  fi
}

stop_and_requeue() {
  local job
  job=$(job_to_requeue)
  echo "time limit near: stopping at a checkpoint, then requeueing job $job" >&2
  kill -TERM "$step_pid" 2>/dev/null || true  # srun forwards SIGTERM to every task
  wait "$step_pid" || true
  scontrol requeue "$job"
  exit 0
}
