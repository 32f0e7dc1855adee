"""Under CI=true a skip is a failure (tests/conftest.py), except the ones no CI machine can meet (issue 50)."""

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))

TESTS = """
import pytest

def test_needs_a_package():
    pytest.importorskip("a_package_that_is_not_there")

def test_needs_chattr():
    pytest.skip("cannot make a folder read-only here (chattr +i failed)")

def test_runs():
    assert True
"""


@pytest.mark.parametrize("ci", ["true", ""])
def test_a_skip_fails_under_ci_unless_no_ci_machine_can_meet_it(tmp_path, ci):
  (tmp_path / "test_some.py").write_text(TESTS)
  (tmp_path / "test_module.py").write_text("import pytest\npytest.importorskip('another_missing_package')\n")
  (tmp_path / "pytest.ini").write_text("[pytest]\n")  # not the project's addopts
  env = {**os.environ, "CI": ci, "PYTHONPATH": HERE + os.pathsep + os.environ.get("PYTHONPATH", "")}

  def pytest_(name):
    return subprocess.run(
      [sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-rfEs", "-q", name],
      cwd=tmp_path,
      env=env,
      capture_output=True,
      text=True,
      timeout=120,
    )

  tests, module = pytest_("test_some.py"), pytest_("test_module.py")  # a skip in a test, and of a whole module
  out = tests.stdout + tests.stderr
  if ci:
    assert tests.returncode == 1 and "1 failed, 1 passed, 1 skipped" in out, out
    assert "skipped under CI=true" in out and "a_package_that_is_not_there" in out
    assert module.returncode != 0 and "skipped under CI=true" in module.stdout and "another_missing" in module.stdout
  else:
    assert tests.returncode == 0 and "1 passed, 2 skipped" in out, out
    assert module.returncode == 5 and "1 skipped" in module.stdout  # 5: nothing ran
