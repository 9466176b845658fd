"""Starting a job of several processes: on one machine or many over ssh or mpirun, on MXNet's kvstore
(scheduler, servers, workers) or on Horovod.

- :mod:`.plan`: which processes run where, with which environment (computes, starts nothing);
- :mod:`.launcher`: ``launch``, what ``scripts/launch.py`` runs: start, watch, stop on a signal or a
  failure;
- :mod:`.hosts`: the machines of a hostfile, resolved and checked over ssh before a job, swept after;
- :mod:`.remote_agent`: the standalone program each remote process runs under (signals, status);
- :mod:`.mpi`: jobs that OpenMPI's mpirun starts: ``--launcher mpi`` (the kvstore's servers and
  workers) and Horovod over MPI, every rank under the agent's ``mpi`` mode;
- :mod:`.slurm`: a job inside a SLURM allocation: its nodes, one ``srun`` step per process, the
  sweep, the requeue after a save;
- :mod:`.slurm_horovod`: Horovod's ranks under SLURM without horovodrun (from the launcher, or from
  ``srun``'s own numbering), with Horovod's rendezvous server;
- :mod:`.horovod_start`: horovodrun's command line for a plan.
"""
