"""The start of a ``--kv-store horovod`` run: Horovod up, its size said in the first log line, every
rank's flags checked against rank 0's, logs and the summary from rank 0 only.

Training itself needs nothing here: :func:`mxfp16.distributed.kvstore.make_kvstore` returns the
:class:`mxfp16.distributed.horovod.Horovod` kvstore, and the loop shards the data by its rank and saves from
rank 0, as for ``dist_sync``.
"""
import os

from ...distributed.horovod import Horovod
from .plan import JOB_VARIABLE
from .slurm_horovod import prepare_from_srun, srun_tasks

#: Settings that may differ between ranks (each rank's own files); every other one must agree.
PER_RANK_SETTINGS = ("log_file", "tensorboard", "profile_worker_suffix")

#: How a Horovod job is started, for the single-process warning.
LAUNCH_HINT = ("python scripts/launch.py --launcher horovod -n 2 -- python scripts/train_imagenet.py"
               " --kv-store horovod ...  (or horovodrun -np 2 python ...)")


def start_horovod(config):
    """Initialize Horovod for a run; ``(rank, size, line)``, ``line`` the run's first log line.

    Raises
    ------
    mxfp16.distributed.horovod.HorovodUnavailable
        Horovod missing or built without MXNet.
    ValueError
        When the ranks were started with different flags (every rank raises the same error), or
        srun's tasks cannot meet (:func:`.slurm_horovod.prepare_from_srun`).
    """
    srun = prepare_from_srun()  # srun -n N started the ranks: Horovod's variables from SLURM's
    kvstore = Horovod()
    rank, size = kvstore.rank, kvstore.num_workers
    if size == 1:
        return rank, size, ("--kv-store horovod with 1 process: this run was not started by "
                            "horovodrun or mpirun, so it trains alone; for N processes run "
                            + LAUNCH_HINT)
    check_same_flags(kvstore, config.to_dict())
    return rank, size, (f"Horovod: rank {rank} of {size} processes (local rank "
                        f"{kvstore.local_rank}); logs and checkpoints from rank 0"
                        + (f"; {srun}" if srun else ""))


def check_same_flags(kvstore, settings):
    """Raise ValueError on every rank if any rank's ``settings`` differ from rank 0's.

    Horovod itself only notices different tensor shapes; a different ``--lr`` or ``--loss-scale``
    would train silently apart, so each rank's settings are gathered and compared.
    """
    own = {key: value for key, value in settings.items() if key not in PER_RANK_SETTINGS}
    every = kvstore.allgather_object(own, name="flags")
    differing = sorted({key for other in every[1:] for key in set(own) | set(other)
                        if key not in PER_RANK_SETTINGS and other.get(key) != every[0].get(key)})
    if differing:
        details = "; ".join(f"{key}: " + ", ".join(f"rank {r} {s.get(key)!r}"
                                                   for r, s in enumerate(every))
                            for key in differing[:5])
        raise ValueError(f"the Horovod ranks were started with different settings ({details}): "
                         "start every rank with the same command line")


def check_not_under_horovodrun(kv_store, environ=None):
    """Raise ValueError when horovodrun (or ``srun -n N``) started this process but the run would
    not use Horovod.

    Every process would then train alone on the whole data, N runs writing the same files (a
    GluonCV ``train_horovod.py`` command, which needs no ``--kv-store``, does this).

    Examples
    --------
    >>> check_not_under_horovodrun('device', {'HOROVOD_SIZE': '2'})
    Traceback (most recent call last):
    ...
    ValueError: horovodrun started 2 processes but --kv-store is device: ...
    >>> check_not_under_horovodrun('device', {'SLURM_STEP_ID': '0', 'SLURM_STEP_NUM_TASKS': '2'})
    Traceback (most recent call last):
    ...
    ValueError: srun started 2 tasks but --kv-store is device: ...
    >>> check_not_under_horovodrun('device', {'OMPI_COMM_WORLD_SIZE': '4'})
    Traceback (most recent call last):
    ...
    ValueError: mpirun started 4 processes but --kv-store is device: ...
    >>> check_not_under_horovodrun('device', {})
    """
    environ = os.environ if environ is None else environ
    size = int(environ.get("HOROVOD_SIZE", "1") or 1)
    if kv_store != "horovod" and size > 1:
        raise ValueError(f"horovodrun started {size} processes but --kv-store is {kv_store}: "
                         "each would train alone on all the data; pass --kv-store horovod")
    tasks = srun_tasks(environ)
    if kv_store != "horovod" and tasks > 1:
        raise ValueError(f"srun started {tasks} tasks but --kv-store is {kv_store}: each would "
                         "train alone on all the data; pass --kv-store horovod, or run a dist_sync "
                         "job with scripts/launch.py --launcher slurm")
    processes = mpirun_processes(environ)  # after srun's: srun --mpi sets MPI's variables too
    if kv_store != "horovod" and processes > 1:
        raise ValueError(f"mpirun started {processes} processes but --kv-store is {kv_store}: "
                         "each would train alone on all the data; pass --kv-store horovod, or run "
                         "a dist_sync job with scripts/launch.py --launcher mpi")


def mpirun_processes(environ=None):
    """The processes of the MPI job this process is one of when ``mpirun`` started it directly
    (OpenMPI's ``OMPI_COMM_WORLD_SIZE``, MPICH's ``PMI_SIZE``), else 1: not for a kvstore job's
    process (``DMLC_ROLE``: ``--launcher mpi``, MXNet's own tools/launch.py) nor through mxfp16's
    launcher.

    Examples
    --------
    >>> mpirun_processes({'OMPI_COMM_WORLD_SIZE': '4'}), mpirun_processes({'PMI_SIZE': '2'})
    (4, 2)
    >>> mpirun_processes({'OMPI_COMM_WORLD_SIZE': '4', 'DMLC_ROLE': 'worker'})
    1
    """
    environ = os.environ if environ is None else environ
    if JOB_VARIABLE in environ or "DMLC_ROLE" in environ:
        return 1
    return int(environ.get("OMPI_COMM_WORLD_SIZE") or environ.get("PMI_SIZE") or 1)
