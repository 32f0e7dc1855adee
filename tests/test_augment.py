"""Augmentations do what they say, by the amount their magnitude says (issue 50): each RandAugment op measured on an
image built to show it, labels untouched by the pipeline, Mixup and CutMix keeping the label mass."""

import math

import jax
import numpy as np
import pytest

from vitjax.data import augment, device_ops, images


def _op(name, image, level):
  return augment._from_pil(augment.RANDAUGMENT_OPS[name](augment._to_pil(image), level))


def _blob(at, size=41, channels=1):
  """Black (uint8) with a 5x5 white square centred at (row, col)."""
  image = np.zeros((size, size, channels), np.uint8)
  r, c = at
  image[r - 2 : r + 3, c - 2 : c + 3] = 255
  return image


def _centre_of_white(image):
  """(row, col) of the bright pixels' mass (geometric ops fill moved-in pixels with grey 128: left out)."""
  w = np.clip(image[..., 0].astype(np.float64) - 160, 0, None)
  rows, cols = np.indices(w.shape)
  return (rows * w).sum() / w.sum(), (cols * w).sum() / w.sum()


def _texture(channels=3, seed=0):
  """Smooth gradients plus noise, values in 40..200: no op saturates it."""
  rng = np.random.default_rng(seed)
  rows, cols = np.indices((32, 32))
  base = 120 + 40 * np.sin(rows / 5.0)[..., None] * np.cos(cols[..., None] / 7.0 + np.arange(channels))
  return np.clip(base + rng.normal(0, 15, (32, 32, channels)), 40, 200).astype(np.uint8)


@pytest.mark.parametrize("m", [-1.0, -0.5, 0.5, 1.0])
def test_rotate_turns_by_thirty_degrees_times_the_level(m):
  centre, radius = 20, 12
  out = _op("Rotate", _blob((centre, centre + radius)), m)
  r, c = _centre_of_white(out)
  angle = math.degrees(math.atan2(-(r - centre), c - centre))  # counter-clockwise, rows point down
  assert abs(angle - 30.0 * m) < 1.5, angle
  assert abs(math.hypot(r - centre, c - centre) - radius) < 0.5


@pytest.mark.parametrize("m", [-0.6, 0.4])
def test_translate_and_shear_move_pixels_by_their_level(m):
  size = 41
  at = (28, 20)
  for name, shift in (
    ("TranslateX", (0, -0.45 * m * size)),
    ("TranslateY", (-0.45 * m * size, 0)),
    ("ShearX", (0, -0.3 * m * at[0])),
    ("ShearY", (-0.3 * m * at[1], 0)),
  ):
    r, c = _centre_of_white(_op(name, _blob(at, size), m))
    assert abs(r - (at[0] + shift[0])) < 0.6 and abs(c - (at[1] + shift[1])) < 0.6, (name, r, c, shift)


@pytest.mark.parametrize("m", [-0.8, -0.3, 0.3, 0.8])
def test_enhancements_scale_by_one_plus_point_nine_times_the_level(m):
  factor = 1.0 + 0.9 * m
  x = _texture()
  grey = lambda a: a.astype(np.float64) @ np.array([0.299, 0.587, 0.114])  # PIL's "L"
  out = _op("Brightness", x, m).astype(np.float64)
  assert out.mean() / x.mean() == pytest.approx(factor, rel=0.02)
  out = _op("Contrast", x, m).astype(np.float64)  # deviations from the mean grey level
  assert out.std() / x.astype(np.float64).std() == pytest.approx(factor, rel=0.05)
  out = _op("Color", x, m).astype(np.float64)  # each pixel's distance from its own grey
  spread = lambda a: np.abs(a.astype(np.float64) - grey(a)[..., None]).mean()
  assert spread(out) / spread(x) == pytest.approx(factor, rel=0.08)
  sharp = _op("Sharpness", x, m).astype(np.float64)
  detail = lambda a: np.abs(np.diff(a, axis=0)).mean()  # high frequencies: up when sharpening, down when blurring
  assert (detail(sharp) > detail(x.astype(np.float64))) == (m > 0)


def test_solarize_and_posterize_follow_their_thresholds():
  x = np.arange(256, dtype=np.uint8).reshape(16, 16, 1)
  for m in (0.25, -0.5, 1.0):
    threshold = 256 - int(256 * abs(m))
    want = np.where(x >= threshold, 255 - x, x)
    np.testing.assert_array_equal(_op("Solarize", x, m), want)
    bits = 8 - int(4 * abs(m))
    np.testing.assert_array_equal(_op("Posterize", x, m), x & np.uint8((0xFF << (8 - bits)) & 0xFF))


def test_autocontrast_equalize_and_identity():
  x = np.random.default_rng(0).integers(100, 140, (64, 64, 1), dtype=np.uint8)
  out = _op("AutoContrast", x, 0.7)
  assert out.min() == 0 and out.max() == 255
  out = _op("Equalize", x, 0.7)  # a flat histogram: the middle of the pixels near the middle of the range
  assert out.max() == 255 and 100 < np.median(out) < 160
  np.testing.assert_array_equal(_op("Identity", x, 0.7), x)


@pytest.mark.parametrize(
  "name", [n for n in augment.RANDAUGMENT_OPS if n not in ("Identity", "AutoContrast", "Equalize")]
)
def test_every_op_changes_the_image_more_at_a_larger_magnitude(name):
  x = _texture()
  change = [np.abs(_op(name, x, s * m).astype(np.float64) - x).mean() for s in (1, -1) for m in (0.3, 0.9)]
  small, large = change[0::2], change[1::2]
  if name in ("Solarize", "Posterize"):  # unsigned: the sign does nothing
    assert small[0] == small[1] and large[0] == large[1]
  assert all(0 < a < b for a, b in zip(small, large)), change


def test_the_training_transform_leaves_labels_alone():
  aug = augment.Augment(flip=True, randaugment=(3, 9.0), random_resized_crop=((0.3, 1.0), (0.75, 4 / 3)))
  transform = images._TrainPreprocess(size=(24, 24), channels=3, aug=aug)
  rng = np.random.default_rng(0)
  for label in (0, 7, 999):
    example = {"image": _texture(), "label": np.int64(label), "mask": True, "index": 5}
    out = transform.random_map(example, rng)
    assert (
      out["label"] == label
      and out["mask"]
      and out["index"] == 5
      and out["image"].shape == (24, 24, 3)
      and out["image"].dtype == np.uint8
    )


@pytest.mark.parametrize("kind", ["mixup", "cutmix"])
def test_mixup_and_cutmix_keep_the_label_mass_and_match_the_pixels(kind):
  b, classes = 8, 5
  rng = np.random.default_rng(0)
  x = rng.normal(size=(b, 12, 12, 3)).astype(np.float32)
  labels = rng.integers(0, classes, b)
  aug = augment.Augment(mixup_alpha=0.8 if kind == "mixup" else 0.0, cutmix_alpha=1.0 if kind == "cutmix" else 0.0)
  for seed in range(5):
    mixed, soft = (np.asarray(a) for a in device_ops.mix_batch(x, labels, classes, aug, jax.random.key(seed)))
    np.testing.assert_allclose(soft.sum(1), 1.0, atol=1e-6)  # each row a distribution
    np.testing.assert_allclose(soft.sum(0), np.bincount(labels, minlength=classes), atol=1e-5)  # the batch's mass
    partner = x.reshape(b // 2, 2, *x.shape[1:])[:, ::-1].reshape(x.shape)
    own = np.asarray([soft[i, labels[i]] for i in range(b)])  # the label weight of the row's own class
    same_class = labels == labels.reshape(-1, 2)[:, ::-1].reshape(-1)
    if kind == "mixup":
      lam = own[~same_class][0] if (~same_class).any() else None
      if lam is not None:
        np.testing.assert_allclose(mixed, lam * x + (1 - lam) * partner, atol=1e-5)
    else:  # the share of a row's own pixels is its own label's weight
      mine = np.all(np.isclose(mixed, x), axis=-1).mean(axis=(1, 2))
      np.testing.assert_allclose(mine[~same_class], own[~same_class], atol=1e-6)


def test_mix_prob_and_mix_switch_prob_choose_whether_and_how_a_batch_mixes():
  """mix_prob=0 leaves every batch as it was (one-hot labels); with both alphas on, mix_switch_prob=1 makes every
  batch CutMix (each pixel a row's own or its partner's) and 0 every batch Mixup (blended pixels)."""
  b, classes = 8, 5
  rng = np.random.default_rng(1)
  x = rng.normal(size=(b, 10, 10, 3)).astype(np.float32)
  labels = np.arange(b) % classes
  partner = x.reshape(b // 2, 2, *x.shape[1:])[:, ::-1].reshape(x.shape)
  mix = lambda aug, seed: [np.asarray(a) for a in device_ops.mix_batch(x, labels, classes, aug, jax.random.key(seed))]
  for seed in range(2):
    mixed, soft = mix(augment.Augment(mixup_alpha=0.8, cutmix_alpha=1.0, mix_prob=0.0), seed)
    np.testing.assert_array_equal(mixed, x)
    np.testing.assert_array_equal(soft, np.eye(classes, dtype=np.float32)[labels])
    mixed, _ = mix(augment.Augment(mixup_alpha=0.8, cutmix_alpha=1.0, mix_switch_prob=1.0), seed)
    assert ((mixed == x) | (mixed == partner)).all(), seed  # CutMix: whole pixels moved, none blended
    mixed, _ = mix(augment.Augment(mixup_alpha=0.8, cutmix_alpha=1.0, mix_switch_prob=0.0), seed)
    assert not ((mixed == x) | (mixed == partner)).all(), seed  # Mixup: blended pixels


def test_to_float_maps_bytes_to_minus_one_one_or_by_the_channels_mean_and_std():
  """uint8 pixels: 0 -> -1, 255 -> 1 without statistics, else (x / 255 - mean) / std per channel; float images are
  taken as normalised already and pass unchanged."""
  x = np.array([[[[0, 51, 255], [255, 102, 0]]]], np.uint8)  # [1, 1, 2, 3]
  np.testing.assert_allclose(device_ops.to_float(x), x * (2 / 255) - 1, atol=1e-6)
  assert device_ops.to_float(x).dtype == np.float32
  mean, std = (0.5, 0.2, 0.0), (0.25, 0.4, 2.0)
  want = (x / 255 - np.array(mean)) / np.array(std)  # channel 0: (0 - 0.5) / 0.25 = -2, (1 - 0.5) / 0.25 = 2
  np.testing.assert_allclose(device_ops.to_float(x, mean, std), want, rtol=1e-6, atol=1e-6)
  assert want[0, 0, 0, 0] == -2.0 and want[0, 0, 1, 0] == 2.0
  normalised = np.linspace(-3, 3, 6, dtype=np.float32).reshape(1, 1, 2, 3)
  assert device_ops.to_float(normalised, mean, std) is normalised


def test_random_resized_crop_box_keeps_the_aspect_and_area_asked_for():
  rng = np.random.default_rng(0)
  for _ in range(20):
    x0, y0, x1, y1 = augment.random_resized_crop_box(rng, 100, 400, scale=(0.2, 0.3), ratio=(2.0, 3.0))
    w, h = x1 - x0, y1 - y0
    assert 1.9 <= w / h <= 3.1 and 0.19 <= w * h / 40000 <= 0.31, (w, h)
  # no crop of that area fits: the central crop of the largest size whose aspect is clipped into the range
  assert augment.random_resized_crop_box(rng, 100, 400, scale=(1.0, 1.0), ratio=(2.0, 3.0)) == (50, 0, 350, 100)
  assert augment.random_resized_crop_box(rng, 400, 100, scale=(1.0, 1.0), ratio=(0.5, 2.0)) == (0, 100, 100, 300)


def test_randaugment_magnitudes_above_ten_act_as_ten():
  image = _texture()
  for seed in range(3):
    at = lambda magnitude, seed=seed: augment.randaugment(image, np.random.default_rng(seed), 2, magnitude)
    np.testing.assert_array_equal(at(25.0), at(10.0))
    np.testing.assert_array_equal(at(-3.0), at(0.0))


def test_the_centre_crop_starts_where_torchvision_or_transformers_start_it():
  """An odd margin: 40x36 -> 35x32 (the shorter side to 32), cropped to 28x28, 7 rows to spare. torchvision's
  CenterCrop (timm's, the default) starts at round(3.5) = 4, transformers' image processors at 7 // 2 = 3
  (crop_offset="floor", which a transformers hub repository sets); 4 columns to spare start at 2 either way."""
  image = np.arange(40 * 36, dtype=np.int64).reshape(40, 36, 1) % 251
  image = image.astype(np.uint8)
  kw = dict(mean=(0.5,), std=(0.5,), crop_fraction=28 / 32, interpolation="bilinear")
  rounded = augment.preprocess_eval(image, (28, 28), augment.Preprocess(**kw))
  floored = augment.preprocess_eval(image, (28, 28), augment.Preprocess(**kw, crop_offset="floor"))
  resized = augment.resize(image, (35, 32), interpolation="bilinear")
  np.testing.assert_array_equal(rounded, resized[4:32, 2:30])
  np.testing.assert_array_equal(floored, resized[3:31, 2:30])
  described = augment.Preprocess(**kw, crop_offset="floor").describe()
  assert described["crop_offset"] == "floor" and "crop_offset" not in augment.Preprocess(**kw).describe()
  assert augment.Preprocess.from_described(described).crop_offset == "floor"
  with pytest.raises(ValueError, match="crop_offset='ceil': use 'round' or 'floor'"):
    augment.Preprocess(crop_offset="ceil")
