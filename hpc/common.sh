# hpc/common.sh: what the course's job scripts (hpc/train_*.sbatch) have in common. Not a job script:
# each of them sources it, as  source "$SLURM_SUBMIT_DIR/hpc/common.sh"  (sbatch runs a copy of the job
# script from a spool folder, so the course folder is found as the folder you submitted from), then
# calls its steps in this order:
#
#   course_python       activate COURSE_VENV; `python -m course_lib verify` stops the job, saying how to
#                       fix it, when the data set is missing
#   stage_data          STAGE_DATA=1 (folder) or image only: copy the data set (or its squashfs image,
#                       then mounted) to each node's local disk and point COURSE_DATA_DIR at that
#                       copy; unmounted and removed again when the job ends
#   stage_image         (stage_data's STAGE_DATA=image) the copy of the image, mounted with squashfuse
#   check_shm           /dev/shm's free space, with a warning under 1 GB
#   torchrun_logs       (scripts that run torchrun) TORCHRUN_LOGS, a folder of this job's on each node's
#                       local disk for torchrun --log-dir; removed again when the job ends
#   clean_run_dir DIR   rank reports an earlier job of the same name and id left in DIR are removed;
#                       anything else in DIR stops the job
#   show_versions       python, torch and CUDA versions, and the GPUs
#   check_reports DIR   course_lib.train's rank reports in DIR: disjoint shares, the same weights on
#                       every rank; returns 1 (set -e: the job fails) if not
#   on_each_node CMD    runs CMD once on every node of the job (stage_data's copy and clean-up)
#   end_of_job          the EXIT trap sourcing sets: removes, on every node, what stage_data and
#                       torchrun_logs made there (CLEAN_AT_EXIT), and nothing else
#
# Reads these settings, each of which can be given at submission (DATA_SIZE=workshop sbatch ...); sourcing
# gives them their defaults here:
#   COURSE_DATA_DIR   ~/.cache/pytorch-data-course   where `python -m course_lib prepare` put the data (exported)
#   DATA_SIZE         small                          the set prepared with --size
#   STAGE_DATA        0                              1 or folder: stage_data copies the data to the local
#                                                    disk; image: copies its squashfs image and mounts it
#   RUNS_DIR          $PWD/runs                      reports go to $RUNS_DIR/<job name>-<job id>/
#   COURSE_VENV       ~/venvs/pytorch-data-course    empty: the python already on PATH
#   TRAIN_DEVICE      auto                           the training's --device: auto (a GPU per rank where the job
#                                                    sees GPUs, else the CPU and gloo), cpu (gloo, even where the
#                                                    node's GPUs are visible: hpc/class_sbatch's CPU-only jobs)
#   OMP_NUM_THREADS   1                              (exported) threads of each training process
# and Slurm's SLURM_JOB_ID, SLURM_NNODES, SLURM_TMPDIR (or TMPDIR). stage_data sets (and exports)
# COURSE_DATA_DIR, LOCAL_DIR and SET; torchrun_logs sets TORCHRUN_LOGS.
# The job script has already run `set -euo pipefail`; this file relies on it.

# ---- the settings' defaults
# Prepare the data on a LOGIN node: compute nodes usually have no internet, and the course downloads
# nothing anyway. The default is the course's own folder.
export COURSE_DATA_DIR="${COURSE_DATA_DIR:-$HOME/.cache/pytorch-data-course}"
DATA_SIZE="${DATA_SIZE:-small}"
STAGE_DATA="${STAGE_DATA:-0}"
RUNS_DIR="${RUNS_DIR:-$PWD/runs}"     # on several nodes, a shared file system: every node writes there
# A virtual environment with the course installed (pip install -r requirements.txt). Set
# COURSE_VENV= (empty) to use the python already on PATH, e.g. after `module load pytorch`.
COURSE_VENV="${COURSE_VENV-$HOME/venvs/pytorch-data-course}"
# Slurm hides no GPU from a job that asked for none unless the site's cgroups do (ConstrainDevices): "auto" would
# then train on GPUs other jobs were given. A job without GPUs says cpu (TRAIN_ARGS' own --device still wins).
TRAIN_DEVICE="${TRAIN_DEVICE:-auto}"
# one thread per training process (torchrun's default too): the DataLoader workers do the CPU work
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

course_python() {
    # module load pytorch-gpu/py3/2.4.0     # on sites with modules, instead of (or before) a venv
    if [[ -n "$COURSE_VENV" && -f "$COURSE_VENV/bin/activate" ]]; then
        set +u; source "$COURSE_VENV/bin/activate"; set -u   # activate scripts are not written for set -u
    else
        echo "no virtual environment at COURSE_VENV='$COURSE_VENV': using $(command -v python || echo 'no python!')"
    fi
    # course_lib comes from the venv (requirements.txt installs it) or from the folder sbatch starts in
    python -m course_lib verify --size "$DATA_SIZE"         # fails here, with the fix, if the data is missing
}

# Each node's local scratch: $SLURM_TMPDIR or $TMPDIR, a per-job folder on many clusters (wiped at the end);
# else /tmp, which is not. stage_data and torchrun_logs make their folders there.
NODE_TMP="${SLURM_TMPDIR:-${TMPDIR:-/tmp}}"

# What this job made on each node's local disk, removed by end_of_job when the job ends: at its end, on an
# error, a requeue or scancel's SIGTERM (bash runs the EXIT trap then too). Only folders added here by
# stage_data and torchrun_logs, never a path read from the environment.
# After scancel or the time limit, Slurm allows no new job step: on the OTHER nodes of a job the
# copies stay (a per-job $SLURM_TMPDIR or $TMPDIR, which the site's epilog wipes, is then the only clean
# way; /tmp is not). The batch script's own node is cleaned here, whatever ended the job.
CLEAN_AT_EXIT=()
UNMOUNT_AT_EXIT=()   # mount points (STAGE_DATA=image), unmounted before CLEAN_AT_EXIT goes
end_of_job() {
    local mountpoint
    for mountpoint in "${UNMOUNT_AT_EXIT[@]}"; do
        fusermount3 -u "$mountpoint" 2> /dev/null || fusermount -u "$mountpoint" 2> /dev/null ||
            umount "$mountpoint" 2> /dev/null || echo "WARNING: could not unmount $mountpoint" >&2
    done
    if (( ${#CLEAN_AT_EXIT[@]} > 0 )); then
        on_each_node rm -rf -- "${CLEAN_AT_EXIT[@]}" || echo "WARNING: could not remove ${CLEAN_AT_EXIT[*]}" >&2
    fi
}
trap end_of_job EXIT

# Runs "$@" once on every node of the job. The batch script runs on the first node only: on several
# nodes srun starts the command on each (a job step); on one node the batch shell is already there.
on_each_node() {
    if (( ${SLURM_NNODES:-1} > 1 )); then
        srun --ntasks="$SLURM_NNODES" --ntasks-per-node=1 "$@"
    else
        "$@"
    fi
}

# Thousands of small image files on a shared file system (GPFS, Lustre, NFS) cost one metadata
# request each, per epoch, shared with every job of the cluster; the local disk answers at once.
# STAGE_DATA=1 (or folder) copies the image folder: one metadata request per file, once per job.
# STAGE_DATA=image copies ONE file, the set packed as a squashfs image on a login node
#   python -m course_lib.storage image "$COURSE_DATA_DIR/shapes-small-seed0"
# and mounts it read-only with squashfuse: the training reads the same folder of files, the shared
# file system served one file. (Apptainer does the same with --bind set.sqsh:/data:image-src=/.)
stage_data() {
    case "$STAGE_DATA" in
        0) return 0 ;;
        1|folder|image) ;;
        *) echo "ERROR: STAGE_DATA=$STAGE_DATA: use 0 (read in place), 1 or folder (copy the folder) or image" \
                "(copy the squashfs image and mount it)" >&2; exit 1 ;;
    esac
    export LOCAL_DIR="$NODE_TMP/course-data-$SLURM_JOB_ID" SET="shapes-$DATA_SIZE-seed0"
    CLEAN_AT_EXIT+=("$LOCAL_DIR")   # end_of_job removes it on every node (unmounting first)
    if [[ "$STAGE_DATA" == image ]]; then
        stage_image
        return 0
    fi
    # Every node copies into a folder named after itself, then renames that into place. Where the
    # "local" disk is in fact shared by several nodes (a $TMPDIR on a shared file system, or nodes
    # that are one machine), the first complete copy wins and the others are dropped, instead of
    # several copies colliding file by file in one folder.
    # (single quotes: the variables are read on each node, from the environment srun passes on)
    local stage_here='part="$LOCAL_DIR/.copy-${SLURMD_NODENAME:-$(hostname)}"
        mkdir -p "$LOCAL_DIR" && rm -rf "$part" && cp -r "$COURSE_DATA_DIR/$SET" "$part" &&
        { mv -T "$part" "$LOCAL_DIR/$SET" 2> /dev/null || rm -rf "$part"; }'
    on_each_node bash -c "$stage_here"
    export COURSE_DATA_DIR="$LOCAL_DIR"
    if (( ${SLURM_NNODES:-1} > 1 )); then
        echo "data copied to every node's local disk: $COURSE_DATA_DIR"
    else
        echo "data copied to the node's local disk: $COURSE_DATA_DIR"
    fi
}

# STAGE_DATA=image: the image copied to the node's local disk and mounted there, at $LOCAL_DIR/$SET,
# by squashfuse (Debian: squashfuse; where users may not mount FUSE file systems, ask the admins, or
# run in Apptainer). end_of_job unmounts it before removing the folder.
stage_image() {
    local image="$COURSE_DATA_DIR/$SET.sqsh"
    if [[ ! -f "$image" ]]; then
        echo "ERROR: no squashfs image $image: make it once on a login node with" \
             "python -m course_lib.storage image \"$COURSE_DATA_DIR/$SET\"" >&2
        exit 1
    fi
    if ! command -v squashfuse > /dev/null; then
        echo "ERROR: squashfuse is not installed on $(hostname): use STAGE_DATA=folder, or Apptainer's" \
             "--bind $image:/data:image-src=/" >&2
        exit 1
    fi
    if (( ${SLURM_NNODES:-1} > 1 )); then
        echo "ERROR: STAGE_DATA=image mounts on one node; on several, use STAGE_DATA=folder or Apptainer's" \
             "--bind $image:/data:image-src=/ on every node" >&2
        exit 1
    fi
    mkdir -p "$LOCAL_DIR/$SET"
    cp "$image" "$LOCAL_DIR/.$SET.sqsh.part"
    mv "$LOCAL_DIR/.$SET.sqsh.part" "$LOCAL_DIR/$SET.sqsh"
    UNMOUNT_AT_EXIT+=("$LOCAL_DIR/$SET")
    squashfuse "$LOCAL_DIR/$SET.sqsh" "$LOCAL_DIR/$SET"
    export COURSE_DATA_DIR="$LOCAL_DIR"
    echo "image copied to the node's local disk and mounted read-only with squashfuse: $COURSE_DATA_DIR/$SET" \
         "($(stat -c %s "$LOCAL_DIR/$SET.sqsh") bytes, one file)"
}

# torchrun keeps its own copy of every rank's output, in a folder it never removes: without --log-dir,
# a new /tmp/torchelastic_* for every run, which piles up on the nodes. The job's .out file has every
# line already (--tee=3), so the scripts give torchrun --log-dir "$TORCHRUN_LOGS", a folder of this
# job's on each node's local disk, and end_of_job removes it.
torchrun_logs() {
    TORCHRUN_LOGS="$NODE_TMP/course-torchrun-$SLURM_JOB_ID"
    CLEAN_AT_EXIT+=("$TORCHRUN_LOGS")
}

# DataLoader workers hand every batch to their training process through shared memory. Containers
# and some nodes allow only 64 MB: workers then die with "Bus error". Needed: about ranks x workers
# x prefetch_factor (2) x bytes per batch, plus slack. (On several nodes this looks at the first;
# the others are normally alike.)
check_shm() {
    local shm_mb
    shm_mb=$(df -Pm /dev/shm 2> /dev/null | awk 'NR == 2 {print $4}' || true)
    if [[ -z "$shm_mb" ]]; then
        echo "WARNING: no /dev/shm on $(hostname): DataLoader workers cannot pass batches on Linux" >&2
    elif (( shm_mb < 1024 )); then
        echo "WARNING: /dev/shm has $shm_mb MB free (under 1 GB): on 'Bus error' use fewer workers or smaller batches" >&2
    else
        echo "/dev/shm: $shm_mb MB free"
    fi
}

# An earlier job of the same name and id may have left the run folder: job ids start again at 1 when
# a cluster is reinstalled. Its rank reports are removed (check_reports would read an old rank3.json
# as one of this job's); anything else in it is not the course's, and the job stops.
clean_run_dir() {  # $1: the job's run folder
    local run_dir="$1" old_reports in_run_dir
    mkdir -p "$run_dir"
    shopt -s nullglob dotglob
    old_reports=("$run_dir"/rank[0-9]*.json "$run_dir"/.rank[0-9]*.json.tmp*)
    in_run_dir=("$run_dir"/*)
    shopt -u nullglob dotglob
    if (( ${#in_run_dir[@]} > ${#old_reports[@]} )); then
        echo "ERROR: $run_dir holds files that are not rank reports; move them away, or set RUNS_DIR" >&2
        exit 1
    elif (( ${#old_reports[@]} > 0 )); then
        rm -f -- "${old_reports[@]}"
        echo "removed ${#old_reports[@]} rank reports an earlier job of the same name and id left in $run_dir"
    fi
}

show_versions() {
    # torch's version file, read without importing torch (which costs seconds, more on a shared file system)
    python -c 'import sys, runpy, importlib.util as u; v = runpy.run_path(u.find_spec("torch").submodule_search_locations[0] + "/version.py"); print("   python", sys.version.split()[0] + ", torch", v["__version__"], "built for CUDA", v["cuda"])'
    echo "   GPUs: ${SLURM_GPUS_ON_NODE:-none} from Slurm, CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-(unset)};" \
         "training with --device $TRAIN_DEVICE"
    if command -v nvidia-smi > /dev/null; then nvidia-smi -L; fi
}

# course_lib.train's reports, one per rank (hpc/README.md explains them): every sample in the last
# epoch's shares, and the same weights on every rank (DDP keeps them equal).
check_reports() {  # $1: the job's run folder
    python - "$1" << 'EOF'
import sys
from course_lib.distributed import read_reports
from course_lib.samplers import coverage

reports = read_reports(sys.argv[1])
n = reports[0]["dataset_len"]
cov = coverage([r["epochs"][-1]["indices"] for r in reports], n)
same = len({r["weights_sha256"] for r in reports}) == 1
print(f"check: {len(reports)} rank reports; last epoch: {cov.distinct} of {n} samples seen, "
      f"{len(cov.repeated)} more than once (the sampler's padding), {len(cov.missing)} never; "
      f"weights identical on every rank: {'yes' if same else 'NO'}")
sys.exit(0 if same and len(reports) == reports[0]["world_size"] else 1)
EOF
}
