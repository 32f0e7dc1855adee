"""Several local processes (jax.distributed on 127.0.0.1, CPU devices): the tiny digits run gives the same curve
on 1 process x 4 devices and 2 processes x 2 devices; SIGTERM to one process of two stops both at one checkpoint,
which resumes on one process and continues the same curve."""

import re
import signal
import socket
import subprocess

import numpy as np
import train_helpers as th


def _port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _start(workdir, processes, devices, args):
  port = _port()
  procs = []
  for i in range(processes):
    flags = ["--multihost", f"--coordinator_address=127.0.0.1:{port}", f"--num_processes={processes}"]
    cmd = th.main_cmd(workdir, *args, *flags, f"--process_id={i}")
    procs.append(
      subprocess.Popen(
        cmd, cwd=th.ROOT, env=th.env(devices), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
      )
    )
  return procs


def _losses(workdir):
  return {r["step"]: r["train/loss"] for r in th.read_metrics(workdir) if "train/loss" in r}


def test_two_processes_follow_the_one_process_curve_and_a_sigterm_to_one_stops_both(run_args, tmp_path):
  one = str(tmp_path / "one")
  th.check_ok(th.run_main(one, *run_args, devices=4))
  ref = _losses(one)
  assert sorted(ref) == list(range(1, 31))

  two = str(tmp_path / "two")
  procs = _start(two, 2, 2, run_args)
  outs = [p.communicate(timeout=300)[0] for p in procs]
  assert [p.returncode for p in procs] == [0, 0], outs[0][-2000:] + outs[1][-2000:]
  assert "4 devices, 2 processes" in outs[0]
  got = _losses(two)
  np.testing.assert_allclose([got[s] for s in range(1, 31)], [ref[s] for s in range(1, 31)], rtol=1e-5)

  cut = str(tmp_path / "cut")
  procs = _start(cut, 2, 2, run_args)
  for line in procs[1].stdout:
    if re.search(r" step 12/30 ", line):
      procs[1].send_signal(signal.SIGTERM)
      break
  outs = [p.communicate(timeout=120)[0] for p in procs]
  assert [p.returncode for p in procs] == [75, 75], outs[0][-2000:] + outs[1][-2000:]
  stopped = {int(m) for out in outs for m in re.findall(r"stopped at step (\d+), checkpoint", out)}
  assert len(stopped) == 1, outs  # both at the same step
  (step,) = stopped
  assert step in th.finished_steps(cut)

  resumed = th.check_ok(th.run_main(cut, *run_args, devices=4))  # one process now
  assert f"at step {step}" in resumed.stderr and "4 devices, 1 processes" in resumed.stderr
  got = _losses(cut)
  np.testing.assert_allclose([got[s] for s in range(1, 31)], [ref[s] for s in range(1, 31)], rtol=1e-5)
