"""vitjax.durations: lengths and cadences in steps, epochs or examples, resolved once into steps."""

import pytest

from vitjax.config import default_config


def test_durations_in_steps_epochs_or_examples_resolve_once_into_steps():
  from vitjax import durations
  from vitjax.errors import ConfigError

  c = default_config()
  c.total_steps, c.schedule.warmup_steps = "10 epochs", "0.5 epoch"
  c.log_every, c.eval_every, c.checkpoint_every = "6400 examples", "2ep", 421
  assert durations.resolve(c, steps_per_epoch=421, examples_per_step=128) == durations.Durations(
    total=4210, warmup=210, log_every=50, eval_every=842, checkpoint_every=421
  )
  c.total_steps, c.num_epochs = None, 1.5
  assert durations.resolve(c, 421, 128).total == 632  # epochs round up to whole steps
  c.log_every = "100 examples"
  assert durations.resolve(c, 421, 128).log_every == 1  # a cadence is at least one step
  with pytest.raises(ConfigError, match="no fixed number of examples; give steps or epochs"):
    durations.resolve(c, 421, None)  # translation: batches by tokens
  for bad, why in (("2 weeks", "with a unit"), ("1.5", "whole number"), (0, "at least 1 step")):
    c.eval_every = bad
    with pytest.raises(ConfigError, match=why):
      durations.check(c)


def test_a_warmup_as_long_as_the_run_is_said(caplog):
  """total_steps=4 with 50 warm-up steps: the lr never reached its peak nor decayed, and nothing said so."""
  from vitjax import durations

  caplog.set_level("INFO", logger="absl")  # (absl's logger: under xdist its level is not the root's)
  c = default_config()
  c.total_steps, c.schedule.warmup_steps, c.schedule.warmup_epochs = 4, 50, 2.0
  assert durations.resolve(c, 10, 128).warmup == 4
  said = [r.getMessage() for r in caplog.records]
  assert any("the warm-up (50 steps) is as long as the run (4)" in m for m in said), said
  assert any("warmup_steps=50 takes precedence over warmup_epochs=2" in m for m in said), said
  caplog.clear()
  c.total_steps, c.schedule.warmup_epochs = 100, None
  durations.resolve(c, 10, 128)
  assert not any("warm-up" in r.getMessage() for r in caplog.records)


def test_durations_edges_round_the_run_up_and_take_a_zero_warmup(caplog):
  """The run's length in epochs rounds up (0.1 epoch of 421 steps is 43 steps, not 42), in either field; a warm-up
  in epochs rounds to the nearest step; 'k' and 'm' scale; a warm-up of 0 is allowed, one as long as the run is
  said; a bool is no duration."""
  from vitjax import durations
  from vitjax.errors import ConfigError

  caplog.set_level("INFO", logger="absl")
  c = default_config()
  c.total_steps, c.num_epochs, c.schedule.warmup_steps, c.schedule.warmup_epochs = None, 0.1, None, 0.999
  assert durations.resolve(c, 421, 128).total == 43
  c.num_epochs = 5
  assert durations.resolve(c, 10, 128).warmup == 10  # 9.99 steps
  c.total_steps, c.num_epochs = "0.1 epochs", None
  assert durations.resolve(c, 421, 128).total == 43
  c.total_steps = "1m examples"
  assert durations.resolve(c, 421, 1000).total == 1000
  assert durations.steps("log_every", "2k ex", 421, 1000) == 2
  c.total_steps, c.schedule.warmup_steps = 50, 0
  caplog.clear()
  assert durations.resolve(c, 421, 128).warmup == 0
  assert not any("warm-up" in r.getMessage() for r in caplog.records)
  c.schedule.warmup_steps = 50  # exactly the run's length: the lr never decays
  assert durations.resolve(c, 421, 128).warmup == 50
  said = [r.getMessage() for r in caplog.records]
  assert any("the warm-up (50 steps) is as long as the run (50): cut to the run's length, it raises the learning rate "
             "to 49/50 of config.optim.lr at the last step" in m for m in said), said  # fmt: skip
  c.log_every = True
  with pytest.raises(ConfigError, match="give steps"):
    durations.check(c)
