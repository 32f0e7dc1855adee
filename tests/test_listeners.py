"""Every listener the tests start is on loopback, and no other local user gets in (issue 76): the test SLURM
cluster's slurmctld and slurmd listen on 127.0.0.1 only and authenticate with a munged of their own, whose socket
only the cluster's user reaches; the PostgreSQL server of the sweep tests has no TCP port, its socket is in a
folder only its user can enter, and it lets in this process's user alone (peer authentication); the documented
docs server binds 127.0.0.1. The sockets are read from the kernel's tables (/proc/net/tcp, tcp6) and tried."""

import glob
import ipaddress
import os
import re
import shutil
import socket
import stat
import subprocess
import sys

import pytest
import slurm_cluster
import train_helpers as th


def _tcp_listeners() -> dict[int, tuple[str, int]]:
  """The machine's listening TCP sockets: (address, port) by socket inode, from /proc/net/tcp and tcp6."""
  found = {}
  for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
    if not os.path.exists(table):
      continue
    for line in open(table).readlines()[1:]:
      fields = line.split()
      if fields[3] != "0A":  # TCP_LISTEN
        continue
      hexaddr, hexport = fields[1].split(":")
      raw = b"".join(bytes.fromhex(hexaddr[i : i + 8])[::-1] for i in range(0, len(hexaddr), 8))
      found[int(fields[9])] = (socket.inet_ntop(family, raw), int(hexport, 16))
  return found


def _listeners(pid: int) -> list[tuple[str, int]]:
  """The TCP sockets process `pid` listens on: (address, port), each once."""
  inodes = set()
  for fd in os.listdir(f"/proc/{pid}/fd"):
    try:
      target = os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
      continue
    m = re.fullmatch(r"socket:\[(\d+)\]", target)
    if m:
      inodes.add(int(m.group(1)))
  return sorted({addr for inode, addr in _tcp_listeners().items() if inode in inodes})


def _is_loopback(addr: str) -> bool:
  ip = ipaddress.ip_address(addr)
  return ip.is_loopback or bool(getattr(ip, "ipv4_mapped", None) and ip.ipv4_mapped.is_loopback)


def _local_addresses() -> list[str]:
  """This machine's IPv4 addresses that are not loopback (from /proc/net/fib_trie's LOCAL entries)."""
  try:
    lines = open("/proc/net/fib_trie").read().splitlines()
  except OSError:
    return []
  found = {prev.split()[-1] for prev, line in zip(lines, lines[1:]) if line.strip() == "/32 host LOCAL"}
  return sorted(a for a in found if not ipaddress.ip_address(a).is_loopback)


def _refused(addr: str, port: int) -> bool:
  with socket.socket() as s:
    s.settimeout(5)
    try:
      s.connect((addr, port))
    except (ConnectionRefusedError, TimeoutError, OSError):
      return True
  return False


def _as_nobody(*cmd) -> subprocess.CompletedProcess:
  return subprocess.run(["runuser", "-u", "nobody", "--", *cmd], capture_output=True, text=True, timeout=60)


# ------------------------------------------------------------------ the test SLURM cluster


@pytest.mark.xdist_group("slurm")  # (with tests/test_slurm.py's cluster: one at a time)
def test_the_slurm_daemons_listen_on_loopback_only_and_authenticate_with_their_own_munge(slurm, tmp_path):
  conf = {}
  for line in open(slurm.env["SLURM_CONF"]):
    key, _, value = line.strip().partition("=")
    conf.setdefault(key, value)
  daemons = {open(f"/proc/{p.pid}/comm").read().strip(): p.pid for p in slurm.procs}
  ports = {"slurmctld": int(conf["SlurmctldPort"]), "slurmd": int(conf["SlurmdPort"])}
  for name, port in ports.items():
    listening = _listeners(daemons[name])
    assert port in {p for _, p in listening}, (name, listening)
    assert all(_is_loopback(addr) for addr, _ in listening), (name, listening)  # no 0.0.0.0, no ::
  for addr in _local_addresses():  # this machine's other addresses reach neither daemon
    assert all(_refused(addr, port) for port in ports.values()), (addr, ports)

  assert conf["AuthType"] == "auth/munge" and conf["CredType"] == "cred/munge", conf
  munge_socket = conf.get("AuthInfo", "").removeprefix("socket=")
  assert munge_socket.startswith(slurm.folder) and stat.S_ISSOCK(os.stat(munge_socket).st_mode), conf
  munge_dir = os.path.dirname(munge_socket)
  assert stat.S_IMODE(os.stat(munge_dir).st_mode) == 0o700
  assert stat.S_IMODE(os.stat(os.path.join(munge_dir, "munge.key")).st_mode) == 0o400
  assert _listeners(daemons["munged"]) == []  # (munged: its Unix socket only)

  # a credential of another key is refused: the daemons check who is asking
  assert slurm.run("squeue", "-h", check=False).returncode == 0
  other_munged, other_socket = slurm_cluster.start_munged(str(tmp_path / "munge"))
  try:
    forged = tmp_path / "slurm.conf"
    forged.write_text(open(slurm.env["SLURM_CONF"]).read().replace(munge_socket, other_socket))
    proc = slurm.run("squeue", "-h", check=False, env={"SLURM_CONF": str(forged)})
    assert proc.returncode != 0, proc.stdout
  finally:
    other_munged.terminate()
    other_munged.wait(timeout=20)
  # and no other local user gets a credential from the cluster's munged at all
  munge = shutil.which("munge") or "/usr/bin/munge"
  proc = _as_nobody(munge, "-n", f"--socket={munge_socket}")
  assert proc.returncode != 0 and not proc.stdout.startswith("MUNGE:"), proc.stdout


# ------------------------------------------------------------------ PostgreSQL (tests/conftest.py's `postgres`)


def _psql() -> str | None:
  found = sorted(glob.glob("/usr/lib/postgresql/*/bin/psql"))
  return found[-1] if found else shutil.which("psql")


def test_the_postgresql_server_has_no_tcp_port_and_lets_in_no_other_user(postgres):
  folder, port = re.search(r"host=([^&]+)&port=(\d+)", postgres).groups()
  sock = os.path.join(folder, f".s.PGSQL.{port}")
  assert stat.S_IMODE(os.stat(folder).st_mode) & 0o077 == 0, oct(os.stat(folder).st_mode)
  assert stat.S_IMODE(os.stat(sock).st_mode) & 0o077 == 0, oct(os.stat(sock).st_mode)
  postmaster = int(open(os.path.join(folder, "data", "postmaster.pid")).readline())
  assert _listeners(postmaster) == []  # (listen_addresses='': the Unix socket only)

  import psycopg2

  with psycopg2.connect(host=folder, port=port, user="vitjax", dbname="postgres") as conn, conn.cursor() as cur:
    cur.execute("select type, user_name, auth_method from pg_hba_file_rules")
    rules = cur.fetchall()
  assert rules and all(method not in ("trust", "password") for _, _, method in rules), rules
  assert all(kind == "local" for kind, _, _ in rules), rules

  if os.getuid() != 0:
    return
  # another user does not reach the socket...
  probe = f"import socket; socket.socket(socket.AF_UNIX).connect({sock!r})"
  proc = _as_nobody("/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable, "-c", probe)
  assert proc.returncode != 0 and "PermissionError" in proc.stderr, proc.stderr
  # ...and the one that does (the server's own) is not let in as vitjax
  psql = _psql()
  if psql:
    cmd = ["runuser", "-u", "postgres", "--", psql, "-h", folder, "-p", port, "-U", "vitjax", "-d", "postgres"]
    proc = subprocess.run([*cmd, "-Atc", "select 1"], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "authentication failed" in proc.stderr, proc.stderr


# ------------------------------------------------------------------ the documented docs server


def test_the_documented_docs_server_binds_loopback():
  pages = [os.path.join(th.ROOT, "README.md"), *glob.glob(os.path.join(th.ROOT, "docs", "**", "*.md"), recursive=True)]
  commands = [(page, line) for page in pages for line in open(page).read().splitlines() if "http.server" in line]
  assert commands  # (the README's)
  for page, line in commands:
    assert "--bind 127.0.0.1" in line, (os.path.relpath(page, th.ROOT), line)
