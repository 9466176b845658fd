"""Starting a job of several processes: on one machine or many over ssh, on MXNet's kvstore
(scheduler, servers, workers) or on Horovod.

- :mod:`.plan`: which processes run where, with which environment (computes, starts nothing);
- :mod:`.launcher`: ``launch``, what ``scripts/launch.py`` runs: start, watch, stop on a signal or a
  failure;
- :mod:`.hosts`: the machines of a hostfile, resolved and checked over ssh before a job, swept after;
- :mod:`.remote_agent`: the standalone program each remote process runs under (signals, status);
- :mod:`.horovod_start`: horovodrun's command line for a plan.
"""
