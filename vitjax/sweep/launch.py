"""Starts a sweep trial's command pinned to its worker's CPU cores, and stopped by SIGTERM if the sweep's process dies.

    python -I -S vitjax/sweep/launch.py SWEEP_PID CORES -- COMMAND...   (CORES: "0,1", or "" for no pinning)

The sweep runs this file by its path, in place of Popen's `preexec_fn`: that runs Python code in the child of a
fork of a multithreaded process (the sweep has imported JAX), which Python documents as unsafe and JAX warns about
("os.fork() was called ... will likely lead to a deadlock"). Here a fresh, single-threaded interpreter (no site, no
vitjax import: milliseconds) sets both and execs the command in the same process, which keeps them: the trial's
threads, all started later, inherit its affinity, and the parent-death signal survives exec. Standard library only.
"""

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> int:
  """Sets up this process for the trial and execs its command; returns an exit status only when it cannot."""
  if len(argv) < 4 or argv[2] != "--":
    print("error: usage: launch.py SWEEP_PID CORES -- COMMAND...", file=sys.stderr)
    return 2
  sweep_pid, cores, _, *cmd = argv
  if sys.platform.startswith("linux"):
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != int(sweep_pid):  # the sweep died before the prctl, so its signal would never come
      print(f"error: the sweep (PID {sweep_pid}) that started this trial is gone", file=sys.stderr)
      return 128 + signal.SIGTERM
  if cores and hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, [int(c) for c in cores.split(",")])
  try:
    os.execvp(cmd[0], cmd)
  except OSError as e:
    print(f"error: cannot run {cmd[0]}: {e.strerror}", file=sys.stderr)
    return 127


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
