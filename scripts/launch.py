"""Launch a dist_sync training job (scheduler, servers, workers), as MXNet's tools/launch.py does,
or a Horovod job through horovodrun, or either inside a SLURM allocation with srun.

    python scripts/launch.py -n 2 -s 1 -- python scripts/train_imagenet.py --kv-store dist_sync ...
    python scripts/launch.py -n 4 -s 2 -H hosts.txt -- python scripts/train_imagenet.py ...
    python scripts/launch.py --launcher horovod -n 2 -H hosts.txt -- python ...
    python scripts/launch.py --launcher horovod -n 2 -- python scripts/train_imagenet.py \
        --kv-store horovod --network resnet50_v1 ...
    python scripts/launch.py --launcher slurm -n 4 -s 2 -- python ...   # in an sbatch script
    python scripts/launch.py --launcher mpi -n 2 -s 1 -H hosts.txt -- python ...
    python scripts/launch.py --launcher horovod --horovod-controller mpi -n 2 -- python ...

runs the command as ``-n`` workers next to ``-s`` servers and one scheduler, on this machine
(127.0.0.1 only) or, with a hostfile, on its hosts through ssh (or mpirun: ``--launcher mpi``); see
:mod:`mxfp16.train.launch.launcher` and :mod:`mxfp16.train.launch.mpi` for the environment each
process gets and how the job ends.  The exit code is 0 when every worker
succeeded, else the first failing process's code; 124 after ``--timeout``, 130 on Ctrl-C.  Errors
in the input print one ``error: ...`` line and exit with code 2.
"""
import argparse
import logging
import os
import shlex
import sys

from mxfp16.train.launch.hosts import read_hostfile
from mxfp16.train.launch.launcher import launch
from mxfp16.train.launch.plan import (FORWARDED_NAMES, FORWARDED_PREFIXES, HOROVOD_CONTROLLERS,
                                      LAUNCH_COMMAND_VARIABLE, LAUNCHERS, LaunchError,
                                      LaunchTimeout)

#: Exit code after --timeout (as timeout(1)) and after Ctrl-C (as a shell).
TIMEOUT_EXIT, INTERRUPT_EXIT = 124, 130


def get_args_parser():
    forwarded = ", ".join([name + "*" for name in FORWARDED_PREFIXES] + list(FORWARDED_NAMES))
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=f"With -H, the servers and workers get these variables of this environment: "
               f"{forwarded}; --env adds others. ssh reads ~/.ssh/config (User, Port, "
               f"IdentityFile per host) and never asks for a password (BatchMode).")
    parser.add_argument("-n", "--num-workers", type=int, required=True,
                        help="number of worker processes")
    parser.add_argument("-s", "--num-servers", type=int, default=None,
                        help="number of server processes (default: the number of workers)")
    parser.add_argument("-H", "--hostfile", default=None,
                        help="file listing the machines, one host, user@host or host:ssh_port "
                             "per line; implies --launcher ssh (default: none, all on this "
                             "machine)")
    parser.add_argument("--launcher", choices=LAUNCHERS, default=None,
                        help="where the servers and workers run; mpi: OpenMPI's mpirun starts "
                             "them (over the hostfile's hosts, or here); horovod: horovodrun over "
                             "Gloo starts the workers, no servers; slurm: each process a job step "
                             "(srun) on the nodes of this SLURM allocation, for dist_sync or "
                             "--kv-store horovod (default: ssh with a hostfile, else local)")
    parser.add_argument("--horovod-controller", choices=HOROVOD_CONTROLLERS, default="gloo",
                        help="with --launcher horovod, what starts the ranks: gloo "
                             "(horovodrun --gloo) or mpi (mpirun, as horovodrun --mpi would; "
                             "needs Horovod built with MPI) (default: gloo)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds before the whole job is stopped (default: none)")
    parser.add_argument("--host-ip", default=None,
                        help="the scheduler's address, reachable from every host (default: "
                             "127.0.0.1 locally; with -H, this machine's address on the route "
                             "to the other hosts; with --launcher slurm, the first node's "
                             "address, and --host-ip must be one of that node's)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME[:VALUE]",
                        help="pass a variable from this environment (NAME) or set one "
                             "(NAME:VALUE) for the servers and workers; repeatable (default: none)")
    parser.add_argument("--log-dir", default=None,
                        help="write each process's output to <log-dir>/<role>-<index>.log "
                             "(default: this terminal)")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="the workers' command, after '--'")
    return parser


def parse_env(items):
    """``['A', 'B:1']`` -> ``{'A': <A here>, 'B': '1'}``."""
    env = {}
    for item in items:
        name, sep, value = item.partition(":")
        if not sep:
            if name not in os.environ:
                raise LaunchError(f"--env {name}: the variable is not set here; set it, or pass "
                                  f"--env {name}:VALUE")
            value = os.environ[name]
        env[name] = value
    return env


def run(args, typed):
    """Launch the job described by the parsed arguments; return its exit code.

    ``typed`` is the launch command as the user typed it, which the workers' "resume with:" line
    repeats.
    """
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    hosts = read_hostfile(args.hostfile) if args.hostfile else None
    launcher = args.launcher or ("ssh" if hosts else "local")
    env = dict(parse_env(args.env), **{LAUNCH_COMMAND_VARIABLE: shlex.join(typed)})
    return launch(command, args.num_workers, args.num_servers, launcher=launcher, hosts=hosts,
                  timeout=args.timeout, root_uri=args.host_ip, env=env, log_dir=args.log_dir,
                  horovod_controller=args.horovod_controller)


def main(argv=None):
    """Run the script; return the exit code (the job's, or 2 on a user error)."""
    script = sys.argv[0] if argv is None else os.path.relpath(__file__)
    argv = sys.argv[1:] if argv is None else list(argv)
    args = get_args_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s: %(message)s")
    try:
        return run(args, [script, *argv])
    except LaunchError as error:  # one line per problem (one per unusable host)
        for line in str(error).splitlines():
            print(f"error: {line}", file=sys.stderr)
        return 2
    except LaunchTimeout as error:
        print(f"error: {error}", file=sys.stderr)
        return TIMEOUT_EXIT
    except KeyboardInterrupt:
        print("error: interrupted: every process of the job was stopped", file=sys.stderr)
        return INTERRUPT_EXIT


if __name__ == "__main__":
    sys.exit(main())
