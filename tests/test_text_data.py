"""Tests of the parallel-text pipeline (vitjax.data.text, vitjax.data.sword).

Every fixture is synthetic and built in tmp_path; the last tests read the real
Debian packages and skip when they are not installed.
"""

import bz2
import collections
import lzma
import os
import struct
import zlib

import numpy as np
import pytest

from vitjax.data import sword, text
from vitjax.errors import ConfigError

# ----------------------------------------------------------------------------
# A fake SWORD zText module, in the binary layout of the real files.


def write_ztext_module(
  root, name, entries_by_testament, *, lang="en", per_block=3, versification="KJV", compress="ZIP", mod_drv="zText"
):
  """Writes ``root/mods.d/<name>.conf`` and ``root/modules/texts/ztext/<name>/
  {ot,nt}.{bzs,bzv,bzz}``; ``entries_by_testament`` maps 'ot'/'nt' to lists
  of entry strings ('' = empty entry), ``per_block`` entries per block (``compress``: ZIP, BZIP2 or XZ;
  ``mod_drv`` zText or zText4, whose verse entries have a 4-byte size)."""
  data_rel = f"modules/texts/ztext/{name.lower()}/"
  os.makedirs(os.path.join(root, "mods.d"), exist_ok=True)
  os.makedirs(os.path.join(root, data_rel), exist_ok=True)
  with open(os.path.join(root, "mods.d", f"{name.lower()}.conf"), "w", encoding="utf-8") as f:
    f.write(
      f"# fake module\n[{name}]\nDataPath=./{data_rel}\nModDrv={mod_drv}\n"
      f"SourceType=OSIS\nEncoding=UTF-8\nCompressType={compress}\n"
      f"BlockType=BOOK\nVersification={versification}\nLang={lang}\n"
      "About=A made-up module \\\n  continued on a second line\n"
      "GlobalOptionFilter=OSISStrongs\nGlobalOptionFilter=OSISFootnotes\n"
    )
  layout = "<III" if mod_drv == "zText4" else "<IIH"
  pack = {"ZIP": zlib.compress, "BZIP2": bz2.compress, "XZ": lzma.compress}[compress]
  for testament, entries in entries_by_testament.items():
    bzs, bzv, bzz = b"", b"", b""
    for start in range(0, len(entries), per_block):
      block_no = start // per_block
      raw = b""
      for entry in entries[start : start + per_block]:
        data = entry.encode("utf-8")
        if data:
          bzv += struct.pack(layout, block_no, len(raw), len(data))
        else:
          bzv += struct.pack(layout, 0, 0, 0)
        raw += data
      comp = pack(raw)
      bzs += struct.pack("<III", len(bzz), len(comp), len(raw))
      bzz += comp
    prefix = os.path.join(root, data_rel, testament)
    for ext, blob in ((".bzs", bzs), (".bzv", bzv), (".bzz", bzz)):
      with open(prefix + ext, "wb") as f:
        f.write(blob)


def w(word, num):
  return f'<w lemma="strong:H{num:04d}">{word}</w>'


# (marked-up entry, expected plain text); made-up verses in OSIS style.
EN_ENTRIES = [
  ("", ""),
  ('<milestone type="x-importer" subType="x-osis2mod" n="$Rev: 1 $"/>', ""),
  ('<div osisID="Bk" sID="b1" type="book"/> <title type="main">Book of Tests</title> <div sID="p1" type="x-p"/>', ""),
  ('<chapter n="1" osisID="Bk.1" sID="Bk.1"/> ', ""),
  (
    f"At {w('first', 1)} the {w('robot', 2)} {w('made', 3)} a "
    f'<transChange type="added">small</transChange> {w("lamp", 4)}.',
    "At first the robot made a small lamp.",
  ),
  (
    f'{w("And", 5)} it {w("shone", 6)}.<note placement="foot"><reference '
    f'type="annotateRef">1.2 </reference>shone: or, <seg>glowed</seg></note> '
    '<div eID="p1" type="x-p"/>',
    "And it shone.",
  ),
  (
    f'<title canonical="true" type="psalm">A {w("song", 7)}.</title> '
    f'<lg sID="g1"/><l level="1" sID="g2"/>{w("Sing", 8)} &amp; '
    f'<divineName>{w("dance", 9)}</divineName>;<l eID="g2"/><l sID="g3"/>'
    "loud\\nd ly\\+nd*!",
    "A song. Sing & dance; loud ly!",
  ),
  (f'<title><foreign>ALEPH.</foreign></title> \u00b6 <q who="x">{w("Quote", 10)}</q>  here\n\ttoo.', "Quote here too."),
]
ES_ENTRIES = [
  ("", ""),
  ('<milestone type="x-importer" n="x"/>', ""),
  ('<div osisID="Bk" type="book"/> <title type="main">Libro</title>', ""),
  ('<chapter n="1" osisID="Bk.1"/> ', ""),
  (
    f"{w('Al principio', 1)} {w('el robot', 2)} {w('hizo', 3)} "
    f'{w("una lámpara", 4)} <transChange type="added">pequeña</transChange>.',
    "Al principio el robot hizo una lámpara pequeña.",
  ),
  (f"{w('Y', 5)} {w('brilló', 6)}.", "Y brilló."),
  (f"{w('Canción', 7)}. {w('Canta', 8)} y {w('baila', 9)}; ¡fuerte!", "Canción. Canta y baila; ¡fuerte!"),
  (f"{w('Cita', 10)} aquí también.", "Cita aquí también."),
]
NT_EN = [
  ("", ""),
  ('<milestone type="x"/>', ""),
  (f"{w('Last', 11)} {w('words', 12)} &lt;end&gt;.", "Last words <end>."),
]
NT_ES = [("", ""), ("", ""), (f"{w('Últimas', 11)} {w('palabras', 12)}.", "Últimas palabras.")]


@pytest.fixture
def fake_bible(tmp_path):
  root = str(tmp_path / "sword")
  write_ztext_module(root, "engKJV2006eb", {"ot": [e for e, _ in EN_ENTRIES], "nt": [e for e, _ in NT_EN]})
  write_ztext_module(
    root, "spaRV1909eb", {"ot": [e for e, _ in ES_ENTRIES], "nt": [e for e, _ in NT_ES]}, lang="es", per_block=2
  )
  return root


def test_sword_reader_reads_back_raw_and_plain(fake_bible):
  conf, raw = sword.read_module("engkjv2006EB", [fake_bible], plain=False)
  assert conf.name == "engKJV2006eb" and conf.mod_drv == "zText"
  assert conf.versification == "KJV" and conf.source_type == "OSIS"
  assert conf.entries["About"].endswith("continued on a second line")
  assert os.path.isdir(conf.data_path)
  assert raw == [e for e, _ in EN_ENTRIES + NT_EN]
  _, plain = sword.read_module("engKJV2006eb", [fake_bible])
  assert plain == [p for _, p in EN_ENTRIES + NT_EN]
  _, plain_es = sword.read_module("spaRV1909eb", [fake_bible])
  assert plain_es == [p for _, p in ES_ENTRIES + NT_ES]
  with pytest.raises(sword.ModuleNotFoundInLibraryError):
    sword.find_module("noSuchModule", [fake_bible])


@pytest.mark.parametrize("compress,mod_drv", [("BZIP2", "zText"), ("XZ", "zText4")])
def test_sword_reader_reads_the_conf_compression_and_ztext4(tmp_path, compress, mod_drv):
  """The conf's CompressType (BZIP2, XZ) and ModDrv zText4 (12-byte verse entries) read back the same entries; of a
  repeated conf key the first value counts."""
  root = str(tmp_path / "sword")
  entries = {"ot": [e for e, _ in EN_ENTRIES], "nt": [e for e, _ in NT_EN]}
  write_ztext_module(root, "engKJV2006eb", entries, compress=compress, mod_drv=mod_drv)
  conf, raw = sword.read_module("engKJV2006eb", [root], plain=False)
  assert (conf.compress_type, conf.mod_drv) == (compress, mod_drv)
  assert conf.entries["GlobalOptionFilter"] == "OSISStrongs"
  assert raw == entries["ot"] + entries["nt"]


def test_sword_reader_refuses_enciphered_and_corrupt_modules(tmp_path):
  """An enciphered module (CipherKey) and a block whose size disagrees with its index are errors, not garbled text."""
  root = str(tmp_path / "sword")
  write_ztext_module(root, "engKJV2006eb", {"ot": [e for e, _ in EN_ENTRIES]})
  conf = sword.find_module("engKJV2006eb", [root])
  prefix = os.path.join(conf.data_path, "ot")
  with open(prefix + ".bzs", "rb") as f:
    bzs = bytearray(f.read())
  start, csize, usize = struct.unpack_from("<III", bzs, 12)
  struct.pack_into("<III", bzs, 12, start, csize, usize + 1)  # block 1 says one byte more than it holds
  with open(prefix + ".bzs", "wb") as f:
    f.write(bzs)
  with pytest.raises(ValueError, match=f"ot.bzz block 1: {usize} bytes after decompression, index says {usize + 1}"):
    sword.read_testament(prefix)
  with open(conf.conf_path, "a", encoding="utf-8") as f:
    f.write("CipherKey=secret\n")
  with pytest.raises(ValueError, match="engKJV2006eb is enciphered"):
    sword.read_module("engKJV2006eb", [root])


def test_strip_markup_other_dialects():
  # GBF: Strong's tags, footnotes and titles; ThML: sync tags, notes.
  assert (
    sword.strip_markup("<TS>Heading<Ts>In the beginning<WH07225> God<WH0430><FI> made<Fi><RF>a note<Rf> it.<CM>")
    == "In the beginning God made it."
  )
  assert sword.strip_markup(
    'In<sync type="Strongs" value="H07225"/> the beginning<note n="a">'
    "lit. <i>head</i></note> was &quot;it&quot;<br/>next"
  ) == ('In the beginning was "it" next')
  assert sword.strip_markup('<milestone type="x-p"/>  a\u00b6  b ') == "a b"


def test_bible_pairs_from_fake_modules(fake_bible):
  stats = {}
  pairs = text.bible_pairs(fake_bible, stats=stats)
  expected = [(a, b) for (_, a), (_, b) in zip(EN_ENTRIES + NT_EN, ES_ENTRIES + NT_ES) if a and b]
  assert pairs == expected and len(pairs) == 5
  assert stats["entries"] == len(EN_ENTRIES + NT_EN)
  assert stats["misaligned"] == 0
  es_en = text.load_pairs("bible", src_lang="es", tgt_lang="en", data_dir=fake_bible)
  assert es_en == [(b, a) for a, b in expected]
  with pytest.raises(ValueError):
    text.load_pairs("bible", src_lang="en", tgt_lang="de", data_dir=fake_bible)


def test_verse_references_and_the_split_by_books(fake_bible):
  refs = []
  pairs = text.load_pairs("bible", src_lang="en", tgt_lang="es", data_dir=fake_bible, refs=refs)
  assert refs[:4] == ["Bk.1.1", "Bk.1.2", "Bk.1.3", "Bk.1.4"] and len(refs) == len(pairs)
  with pytest.raises(ValueError, match="has no verse references"):
    text.load_pairs("tsv:/nonexistent", src_lang="a", tgt_lang="b", refs=[])

  pairs = [("a", "A"), ("b", "B"), ("c", "C"), ("a", "A"), ("d", "D"), ("e", "E"), ("c", "C")]
  refs = ["Gen.1.1", "Gen.1.2", "Ruth.1.1", "Ruth.1.2", "Job.1.1", "Job.1.2", "Job.1.3"]
  got = text.split_by_books(pairs, refs, ["Ruth"], ["Job"])
  # each held-out book whole; a pair also held out leaves train, and a pair in both held-out books stays in test
  assert got == {"train": [("b", "B")], "valid": [("a", "A")], "test": [("d", "D"), ("e", "E"), ("c", "C")]}
  for valid, test, says in (
    (["Ruht"], ["Job"], "valid_books: no book Ruht; the books are Gen Ruth Job"),
    (["Job"], ["Job"], "Job both in valid_books and test_books"),
    ([], ["Job"], "needs both valid_books and test_books"),
  ):
    with pytest.raises(ValueError, match=says):
      text.split_by_books(pairs, refs, valid, test)


def test_bible_misaligned_and_missing(tmp_path):
  root = str(tmp_path / "sword")
  en = [""] + [f"{w('a' * k, k)} {w('b' * k, 100 + k)} x" for k in range(1, 9)]
  es = list(en)
  es[3], es[4] = es[4], es[3]  # a shifted pair: Strong's numbers disagree
  write_ztext_module(root, "engKJV2006eb", {"ot": en})
  with pytest.raises(text.SourceNotAvailableError, match="apt-get install sword-text-sparv"):
    text.bible_pairs(root)
  write_ztext_module(root, "spaRV1909eb", {"ot": es})
  stats = {}
  pairs = text.bible_pairs(root, stats=stats)
  assert stats["misaligned"] == 2 and len(pairs) == 6
  assert len(text.bible_pairs(root, check_alignment=False)) == 8
  write_ztext_module(root, "spaRV1909eb", {"ot": es[:-1]})
  with pytest.raises(ValueError, match="versification"):
    text.bible_pairs(root)


# ----------------------------------------------------------------------------
# Ding, TSV, two files, tfds.

DING_LINES = [
  "# Version :: test",
  "Hund {m} [zool.] | Hunde {pl} :: dog | dogs",
  "Haus {n}; Gebäude {n} (aus Stein) :: house; building (of stone)",
  "etw. verstecken {vt} | versteckend :: to hide {hid; hidden} sth. | hiding",
  "Das ist   gut. [ugs.] :: That is good. [coll.]",
  "eins | zwei | drei :: one | two",  # mismatched alternatives: skipped
  "kaputt {adj} | (ganz kaputt :: broken | (totally broken",  # unbalanced
  "no separator here",
  "",
]


def test_parse_ding_lines():
  parsed = [text.parse_ding_line(line) for line in DING_LINES]
  assert parsed == [
    [],
    [("Hund", "dog"), ("Hunde", "dogs")],
    [("Haus", "house")],
    [("etw. verstecken", "to hide sth."), ("versteckend", "hiding")],
    [("Das ist gut.", "That is good.")],
    [],
    [("kaputt", "broken")],
    [],
    [],
  ]
  assert text.parse_ding_line(DING_LINES[2], synonyms="all") == [
    ("Haus", "house"),
    ("Haus", "building"),
    ("Gebäude", "house"),
    ("Gebäude", "building"),
  ]


def test_ding_source(tmp_path):
  with open(tmp_path / "de-en", "w", encoding="utf-8") as f:
    f.write("\n".join(DING_LINES) + "\n")
  de_en = text.load_pairs("ding", src_lang="de", tgt_lang="en", data_dir=str(tmp_path))
  assert de_en[:2] == [("Hund", "dog"), ("Hunde", "dogs")] and len(de_en) == 7
  en_de = text.load_pairs("ding", src_lang="en", tgt_lang="de", data_dir=str(tmp_path))
  assert en_de == [(b, a) for a, b in de_en]
  with pytest.raises(text.SourceNotAvailableError, match="apt-get install trans-de-en"):
    text.load_pairs("ding", src_lang="de", tgt_lang="en", data_dir=str(tmp_path / "missing"))


def test_tsv_and_files_sources(tmp_path):
  tsv = tmp_path / "p.tsv"
  tsv.write_text("ein  Satz\ta sentence\nohne tab\n\tleer\nzwei\ttwo\textra\n", encoding="utf-8")
  assert text.load_pairs(f"tsv:{tsv}", src_lang="de", tgt_lang="en") == [("ein Satz", "a sentence"), ("zwei", "two")]
  src, tgt = tmp_path / "s.txt", tmp_path / "t.txt"
  src.write_text("eins\n\ndrei \n", encoding="utf-8")
  tgt.write_text("one\ntwo\nthree\n", encoding="utf-8")
  assert text.load_pairs(f"files:{src},{tgt}", src_lang="de", tgt_lang="en") == [("eins", "one"), ("drei", "three")]
  tgt.write_text("one\n", encoding="utf-8")
  with pytest.raises(ValueError, match="line-aligned"):
    text.load_pairs(f"files:{src},{tgt}", src_lang="de", tgt_lang="en")
  with pytest.raises(ValueError, match="Unknown text source"):
    text.load_pairs("nope", src_lang="de", tgt_lang="en")


def test_tfds_source(tmp_path):
  tfds = pytest.importorskip("tensorflow_datasets")

  class ToyTextTranslate(tfds.core.GeneratorBasedBuilder, skip_registration=True):  # read back from files
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
      return tfds.core.DatasetInfo(
        builder=self, supervised_keys=("de", "en"), features=tfds.features.Translation(languages=("de", "en"))
      )

    def _split_generators(self, dl_manager):
      return {"train": self._generate_examples(4), "validation": self._generate_examples(2)}

    def _generate_examples(self, n):
      for i in range(n):
        yield i, {"de": f"Satz  {i}", "en": f"sentence {i}"}

  data_dir = str(tmp_path / "tfds")
  with pytest.raises(text.SourceNotAvailableError, match="tfds build toy_text_translate --file_format=array_record"):
    text.load_pairs("tfds:toy_text_translate", src_lang="de", tgt_lang="en", data_dir=data_dir)
  ToyTextTranslate(data_dir=data_dir, file_format="array_record").download_and_prepare()
  train = text.load_pairs("tfds:toy_text_translate", src_lang="en", tgt_lang="de", data_dir=data_dir)
  assert sorted(train) == [(f"sentence {i}", f"Satz {i}") for i in range(4)]
  valid = text.load_pairs("tfds:toy_text_translate:validation", src_lang="de", tgt_lang="en", data_dir=data_dir)
  assert sorted(valid) == [(f"Satz {i}", f"sentence {i}") for i in range(2)]
  with pytest.raises(ValueError, match="no keys"):
    text.load_pairs("tfds:toy_text_translate", src_lang="fr", tgt_lang="en", data_dir=data_dir)


# ----------------------------------------------------------------------------
# Splits.


def test_split_pairs_deterministic_disjoint_deduplicated():
  pairs = [(f"s{i}", f"t{i}") for i in range(200)]
  pairs += pairs[:50] + [("s0", "other")]  # exact duplicates and a near one
  a = text.split_pairs(pairs, seed=3, num_valid=20, num_test=30)
  b = text.split_pairs(list(pairs), seed=3, num_valid=20, num_test=30)
  c = text.split_pairs(pairs, seed=4, num_valid=20, num_test=30)
  assert a == b and a["test"] != c["test"]
  assert (len(a["train"]), len(a["valid"]), len(a["test"])) == (151, 20, 30)
  sets = {k: set(v) for k, v in a.items()}
  assert not sets["train"] & sets["test"] and not sets["train"] & sets["valid"]
  assert not sets["valid"] & sets["test"]
  assert set().union(*sets.values()) == set(pairs)
  order = {p: i for i, p in enumerate(dict.fromkeys(pairs))}
  for split in a.values():  # corpus order within each split
    assert [order[p] for p in split] == sorted(order[p] for p in split)
  with pytest.raises(ValueError):
    text.split_pairs(pairs, seed=0, num_valid=200, num_test=100)


# ----------------------------------------------------------------------------
# Tokenizer and batches on a synthetic corpus.


def synthetic_pairs(n=1500, seed=0):
  """Made-up 'languages': random pseudo-words; the target reverses the word
  order and spells each word backwards. Lengths from 1 to 40 words."""
  rng = np.random.default_rng(seed)
  syllables = ["ka", "lo", "mi", "tu", "re", "sa", "no", "vi", "pe", "zu"]
  words = sorted({"".join(rng.choice(syllables, rng.integers(1, 4))) for _ in range(300)})
  pairs = []
  for i in range(n):
    k = int(min(40, rng.geometric(0.12)))
    src = rng.choice(words, k).tolist() + [f"n{i}"]
    pairs.append((" ".join(src), " ".join(x[::-1] for x in reversed(src))))
  return pairs


@pytest.fixture(scope="module")
def corpus():
  return synthetic_pairs()


@pytest.fixture(scope="module")
def tok(corpus, tmp_path_factory):
  prefix = str(tmp_path_factory.mktemp("spm") / "joint")
  return text.Tokenizer.train([t for p in corpus for t in p], prefix, vocab_size=300, character_coverage=1.0)


def test_tokenizer_ids_roundtrip_unknown(tok, corpus, tmp_path):
  sp = tok.sp
  assert (sp.pad_id(), sp.eos_id(), sp.bos_id(), sp.unk_id()) == (0, 1, 2, 3)
  assert (tok.PAD, tok.EOS, tok.BOS, tok.UNK) == (0, 1, 2, 3)
  assert tok.vocab_size <= 300
  for src, tgt in corpus[:50]:
    for s in (src, tgt):
      ids = tok.encode(s)
      assert ids and min(ids) > 3  # no bos/eos/pad/unk added
      assert tok.decode(ids) == s
      assert tok.decode([2] + ids + [1, 7, 8] + [0] * 3) == s  # stops at eos
  ids = tok.encode("ka \u2603 lo")  # a snowman never seen in training
  assert 3 in ids
  assert 3 in tok.encode("\u00e9")  # so is an accented letter
  reloaded = text.Tokenizer.load(tok.path)
  assert reloaded.encode(corpus[0][0]) == tok.encode(corpus[0][0])


def test_tokenizer_with_other_special_ids(corpus, tmp_path):
  """pad 1, eos 2 and bos = pad (no bos piece, decoding starts from pad, as flax's wmt): unk takes 0; batches
  end with that eos and are padded with that pad."""
  tok = text.Tokenizer.train(
    [t for p in corpus[:300] for t in p],
    str(tmp_path / "ids"),
    vocab_size=120,
    character_coverage=1.0,
    pad_id=1,
    eos_id=2,
    bos_id=1,
  )
  assert (tok.PAD, tok.EOS, tok.BOS, tok.UNK) == (1, 2, 1, 0) and tok.sp.bos_id() == -1
  assert tok.special_ids == {"pad_id": 1, "eos_id": 2, "bos_id": 1}
  ids = tok.encode(corpus[0][0])
  assert tok.decode(ids + [2, 5, 6]) == corpus[0][0] and tok.decode([1] + ids + [1]) == corpus[0][0]
  (b,) = text.make_eval_batches(corpus[:4], tok, batch_size=4, max_len=128)
  for row, m in zip(b["src"], b["src_mask"]):
    n = int(m.sum())
    assert row[n - 1] == 2 and (row[n:] == 1).all() and (m == (row != 1)).all()
  with pytest.raises(ValueError, match="must differ"):
    text.Tokenizer.train(["a b"], str(tmp_path / "bad"), vocab_size=10, pad_id=1, eos_id=1)


def test_a_vocab_size_the_text_cannot_fill_is_one_line_naming_the_sizes_that_work(tmp_path):
  """SentencePiece's vocabulary-size failures are one ConfigError line with the bound to give (at most N pieces, or
  the N characters); a tokenizer's decode skips ids outside its vocabulary."""
  texts = ["ka lo mi tu re", "mi tu ka", "re lo ka mi"] * 10  # 15 characters with the specials; at most 18 pieces
  train = lambda v, name: text.Tokenizer.train(texts, str(tmp_path / name), vocab_size=v, character_coverage=1.0)
  with pytest.raises(ConfigError, match=r"^vocab_size=500 is more pieces than 30 sentences give: at most 18$"):
    train(500, "high")
  with pytest.raises(ConfigError, match=r"^vocab_size=5 is fewer pieces than the text's 15 characters need$"):
    train(5, "low")
  with pytest.raises(ConfigError, match=r"^vocab_size=3 is too small: the special pieces alone take 4"):
    train(3, "tiny")
  tok = train(18, "ok")
  ids = tok.encode("ka mi")
  assert tok.decode(ids[:1] + [tok.vocab_size, -1, 10**6] + ids[1:]) == "ka mi"


def test_tokenizer_training_deterministic(corpus, tmp_path):
  texts = [t for p in corpus[:600] for t in p]
  vocabs = []
  for k in range(2):  # (the model file also records its own path)
    t = text.Tokenizer.train(
      texts, str(tmp_path / f"m{k}"), vocab_size=200, input_sentence_size=800, seed=5, character_coverage=1.0
    )
    vocabs.append([(t.sp.id_to_piece(i), t.sp.get_score(i)) for i in range(t.vocab_size)])
  assert vocabs[0] == vocabs[1]


def _key(row):
  return tuple(int(x) for x in row[row != 0])


def test_bucketed_batches(tok, corpus):
  it = text.make_batches(corpus, tok, tokens_per_batch=512, max_len=64, batch_multiple=4, seed=1, num_epochs=1)
  buckets = text.default_buckets(64)
  assert buckets == (8, 16, 24, 32, 48, 64)
  expected = {}
  dropped = 0
  for s, t in corpus:
    si, ti = tok.encode(s) + [1], tok.encode(t) + [1]
    if max(len(si), len(ti)) > 64:
      dropped += 1
    else:
      expected[tuple(si)] = tuple(ti)
  stats = it.stats()
  assert stats["dropped_too_long"] == dropped > 0
  assert stats["kept"] == len(expected)
  seen = []
  for batch in it:
    b, length = batch["src"].shape
    assert batch["tgt"].shape == (b, length) and length in buckets
    assert b == it.batch_sizes[length] and b % 4 == 0
    assert batch["src"].dtype == np.int32
    np.testing.assert_array_equal(batch["src_mask"], batch["src"] != 0)
    for src, tgt in zip(batch["src"], batch["tgt"]):
      s, t = _key(src), _key(tgt)
      assert s[-1] == 1 and t[-1] == 1  # EOS last, then only padding
      assert (src[len(s) :] == 0).all() and (tgt[len(t) :] == 0).all()
      assert expected[s] == t
      seen.append(s)
  assert len(seen) == len(set(seen)) == len(expected) - stats["unused_per_epoch"]
  assert stats["unused_per_epoch"] < it.batch_sizes[64]
  assert len(seen) > 0.9 * len(expected)
  # Bucketing wastes far less than padding everything to max_len would.
  one_bucket = text.make_batches(corpus, tok, tokens_per_batch=512, max_len=64, buckets=(64,))
  assert it.padding_efficiency() > max(0.6, 2 * one_bucket.padding_efficiency())
  # Truncation keeps every pair, EOS last.
  trunc = text.make_batches(corpus, tok, batch_size=8, max_len=32, too_long="truncate", num_epochs=1)
  assert trunc.stats()["truncated"] > 0 and trunc.stats()["kept"] == len(corpus)
  for batch in trunc:
    assert batch["src"].shape[1] <= 32
    for row in batch["src"]:
      assert _key(row)[-1] == 1


def test_sharding_two_processes(tok, corpus):
  data = text.EncodedPairs(corpus, tok, 64)
  its = [
    text.make_batches(data, batch_size=16, max_len=64, seed=2, num_epochs=2, process_index=p, process_count=2)
    for p in range(2)
  ]
  outs = [list(it) for it in its]
  assert len(outs[0]) == len(outs[1]) == 2 * its[0].steps_per_epoch > 0
  per_epoch = its[0].steps_per_epoch
  for a, b in zip(*outs):
    assert a["src"].shape == b["src"].shape and a["tgt"].shape == (b["tgt"].shape)
  for epoch in range(2):
    sl = slice(epoch * per_epoch, (epoch + 1) * per_epoch)
    rows = [{_key(r) for batch in out[sl] for r in batch["src"]} for out in outs]
    assert not rows[0] & rows[1]
    assert len(rows[0]) == len(rows[1]) == per_epoch * 8  # batch_size is global
  # The second epoch is shuffled differently.
  assert not all(np.array_equal(x["src"], y["src"]) for x, y in zip(outs[0][:per_epoch], outs[0][per_epoch:]))


def test_global_batches_do_not_depend_on_the_process_count(tok, corpus):
  """1, 2 and 4 processes: the processes' rows put together are the same global batches (empty rows up to
  pad_multiple at the end), and a position saved with one process count resumes with another."""
  data = text.EncodedPairs(corpus, tok, 64)

  def its(processes, pad=4, **kw):
    return [
      text.make_batches(
        data, tokens_per_batch=300, max_len=64, seed=3, process_index=p, process_count=processes, pad_multiple=pad
      )
      for p in range(processes)
    ]

  def global_batches(iterators, n):
    out = []
    for _ in range(n):
      parts = [next(it) for it in iterators]
      out.append({k: np.concatenate([p[k] for p in parts]) for k in parts[0]})
    return out

  one = global_batches(its(1), 12)
  assert any(not b["src"][-1].any() for b in one)  # 300 // L is often not a multiple of 4: empty rows
  for b in one:
    assert len(b["src"]) % 4 == 0
    empty = ~b["src"].any(axis=1)
    assert (np.diff(empty.astype(int)) >= 0).all()  # empty rows come last
    assert not b["tgt"][empty].any() and not b["tgt_mask"][empty].any()
  for processes in (2, 4):
    got = global_batches(its(processes), 12)
    for a, b in zip(one, got):
      for k in a:
        np.testing.assert_array_equal(a[k], b[k])
  # More padding (8 devices) adds empty rows only.
  wide = global_batches(its(1, pad=8), 12)
  for a, b in zip(one, wide):
    n = int(a["src"].any(axis=1).sum())
    np.testing.assert_array_equal(a["src"][:n], b["src"][:n])
    assert not b["src"][n:].any()
  # A position saved by 2 processes resumes on 4 (and the data position is the same on every process).
  two = its(2)
  for _ in range(5):
    for it in two:
      next(it)
  assert two[0].get_state() == two[1].get_state()
  four = its(4)
  for it in four:
    it.set_state(two[0].get_state())
  np.testing.assert_array_equal(global_batches(four, 1)[0]["src"], one[5]["src"])
  with pytest.raises(ValueError, match="pad_multiple 6 is not a positive multiple of process_count 4"):
    its(4, pad=6)


def test_state_save_restore(tok, corpus):
  data = text.EncodedPairs(corpus, tok, 64)

  def make(seed=7):
    return text.make_batches(data, tokens_per_batch=256, max_len=64, seed=seed, process_index=1, process_count=2)

  it = make()
  per_epoch = it.steps_per_epoch
  for _ in range(per_epoch - 3):  # resume just before an epoch boundary
    next(it)
  state = it.get_state()
  assert state["epoch"] == 0 and state["step"] == per_epoch - 3
  expected = [next(it) for _ in range(8)]
  resumed = make()
  resumed.set_state(dict(state))
  got = [next(resumed) for _ in range(8)]
  for a, b in zip(expected, got):
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])
  assert resumed.get_state() == it.get_state()
  assert resumed.get_state()["epoch"] == 1
  with pytest.raises(ValueError):
    make(seed=8).set_state(state)
  with pytest.raises(ValueError, match=f"step {per_epoch} out of range for {per_epoch} steps per epoch"):
    make().set_state({**state, "step": per_epoch})  # past the epoch's last batch


def test_the_text_api_refuses_what_it_misread(tok, corpus, tmp_path):
  """Each of these gave a silent wrong answer (or a deep error) before: one line now, naming the fix."""
  ids = np.asarray([(tok.encode(s) + [tok.EOS] + [tok.PAD] * 20)[:20] for s in ("ka lo mi", "tu re")])
  assert tok.decode_batch(ids) == [tok.decode(r) for r in ids]
  for call, error, says in (
    (lambda: tok.decode(ids), ValueError, r"decode takes one sequence of ids \[T\]; got shape \[2, 20\]: use decode_b"),
    (lambda: tok.decode_batch(ids[0]), ValueError, "got one sequence"),
    (lambda: tok.encode_batch("ka lo"), TypeError, "not one str"),
    (lambda: text.Tokenizer.load(tok.path.removesuffix(".model")), FileNotFoundError, r"did you mean .*joint\.model"),
    (lambda: text.Tokenizer.train(corpus[:5], str(tmp_path / "t"), 20), TypeError, "text 0 is a tuple: for pairs"),
    (lambda: text.make_eval_batches([s for s, _ in corpus[:4]], tok, batch_size=2), ValueError, r"pairs are \(source"),
    (lambda: text.make_eval_batches(corpus[:4], tok, batch_size=0), ValueError, "batch_size=0 must be a whole num"),
    (
      lambda: text.make_eval_batches(corpus[:4], tok, batch_size=2, process_index=2, process_count=2),
      ValueError,
      r"process_index 2 not in \[0, 2\)",
    ),
    (lambda: text.make_batches(corpus[:4], tok, batch_size=0), ValueError, "batch_size=0 must be a whole number"),
    (lambda: text.split_pairs(corpus, 0, 0.1, 0.1), ValueError, "num_valid=0.1 must be a whole number of pairs"),
    (lambda: text.split_pairs(corpus, None, 10, 10), ValueError, "seed=None must be a whole number"),
  ):
    with pytest.raises(error, match=says):
      call()
  # buckets shorter than max_len: rows kept their EOS only in make_batches, which adds max_len as a bucket
  (batch,) = text.make_eval_batches(corpus[:1], tok, batch_size=1, max_len=32, buckets=[4])
  assert batch["src"].shape[1] >= 4 and _key(batch["src"][0])[-1] == tok.EOS
  comma = tmp_path / "pairs.csv"
  comma.write_text("a b,c d\ne f,g h\n")
  with pytest.raises(ValueError, match="none of its 2 lines is source<TAB>target"):
    text.load_pairs(f"tsv:{comma}", src_lang="en", tgt_lang="es")


def test_eval_batches(tok, corpus):
  pairs = corpus[:75]
  batches = text.make_eval_batches(pairs, tok, batch_size=16, max_len=32)
  assert len(batches) == 5
  seen = []
  for batch in batches:
    b, length = batch["src"].shape
    assert b == 16 and length in text.default_buckets(32)
    for i, ok, s, t, row in zip(batch["index"], batch["mask"], batch["src_text"], batch["tgt_text"], batch["src"]):
      if ok:
        seen.append(i)
        assert (s, t) == pairs[i]
        assert _key(row)[-1] == 1
      else:
        assert i == -1 and s == t == "" and not row.any()
  assert seen == list(range(75))  # in order, nothing dropped
  assert batches[-1]["mask"].sum() == 75 - 64
  shards = [
    text.make_eval_batches(pairs, tok, batch_size=8, max_len=32, process_index=p, process_count=2) for p in range(2)
  ]
  assert len(shards[0]) == len(shards[1]) == 5
  idx = []
  for a, b in zip(*shards):
    assert a["src"].shape == b["src"].shape
    idx += [i for i in a["index"].tolist() + b["index"].tolist() if i >= 0]
  assert sorted(idx) == list(range(75))


def test_an_eval_batch_is_as_long_as_the_smallest_bucket_that_holds_its_longest_pair(tok, corpus):
  """Each evaluation batch's length is the smallest bucket holding its longest pair (source or target, with EOS):
  not the next bucket up, nor the longest one."""
  pairs = [(s, f"{t} {s}") for s, t in corpus[:20]] + corpus[20:40]  # 20 targets longer than their sources
  longest = [1 + max(len(tok.encode(s)), len(tok.encode(t))) for s, t in pairs]  # each pair's tokens, with EOS
  assert len(set(longest)) > 2 and max(longest) <= 128
  for buckets in (None, sorted(set(longest))):  # the default buckets, and one bucket for every length there is
    batches = text.make_eval_batches(pairs, tok, batch_size=4, max_len=128, buckets=buckets)
    for k, b in enumerate(batches):
      need = max(longest[4 * k : 4 * k + 4])
      assert b["src"].shape[1] == min(n for n in [*(buckets or text.default_buckets(128)), 128] if n >= need), k
      for row, mask in zip(b["tgt"][b["mask"]], b["tgt_mask"][b["mask"]]):
        assert row[mask][-1] == tok.EOS  # no target cut short


# ----------------------------------------------------------------------------
# The real Debian data (skipped when the packages are not installed).


def _have_module(name):
  try:
    sword.find_module(name)
    return True
  except sword.ModuleNotFoundInLibraryError:
    return False


@pytest.mark.skipif(
  not (_have_module("engKJV2006eb") and _have_module("spaRV1909eb")),
  reason="apt-get install sword-text-kjv sword-text-sparv",
)
def test_real_bible():
  stats, refs = {}, []
  pairs = text.bible_pairs(stats=stats, refs=refs)
  assert len(pairs) >= 30000 and len(refs) == len(pairs) and refs[0] == "Gen.1.1" and refs[-1] == "Rev.22.21"
  assert len(dict.fromkeys(r.split(".")[0] for r in refs)) == 66  # every book, verses in canonical order
  assert refs[pairs.index(next(p for p in pairs if p[0].startswith("For God so loved the world,")))] == "John.3.16"
  assert stats["misaligned"] < 0.02 * len(pairs)
  assert pairs[0] == (
    "In the beginning God created the heaven and the earth.",
    "EN el principio crió Dios los cielos y la tierra.",
  )
  john = [p for p in pairs if p[0].startswith("For God so loved the world,")]
  assert len(john) == 1 and john[0][1].startswith("Porque de tal manera amó Dios al mundo")
  bad = collections.Counter(c for p in pairs for s in p for c in s if c in "<>\\{}&\u00b6")
  assert not bad


@pytest.mark.skipif(not os.path.exists(text.DING_PATH), reason="apt-get install trans-de-en")
def test_real_ding():
  pairs = text.load_pairs("ding", src_lang="de", tgt_lang="en")
  assert len(pairs) > 10000
  assert sum(len(a.split()) >= 4 for a, _ in pairs) > 1000
  assert not any(c in s for p in pairs[:20000] for s in p for c in "{}[]")


def test_ding_references_are_every_synonym_of_the_entry(tmp_path):
  """A dictionary entry has several right answers: its synonyms are the references that scoring uses."""
  with open(tmp_path / "de-en", "w", encoding="utf-8") as f:
    f.write("\n".join(DING_LINES) + "\n")
  refs = text.load_references("ding", src_lang="de", tgt_lang="en", data_dir=str(tmp_path))
  assert refs[("Haus", "house")] == ["house", "building"] and refs[("Hund", "dog")] == ["dog"]
  back = text.load_references("ding", src_lang="en", tgt_lang="de", data_dir=str(tmp_path))
  assert back[("house", "Haus")] == ["Haus", "Gebäude"]
  assert text.load_references("bible", src_lang="en", tgt_lang="es") is None

  from vitjax.config import translation_config
  from vitjax.tasks import Translation

  config = translation_config("ding", "de", "en")
  config.data.data_dir = str(tmp_path)
  task = Translation(config, str(tmp_path / "w"))
  pairs = [("Haus", "house"), ("Hund", "dog"), ("Das ist gut.", "That is good.")]
  from vitjax.evaluators.translation import synonym_scores

  got = synonym_scores(task.references(), pairs, ["building", "cat", "That is good."])
  assert got["exact_match"] == 2 / 3  # 'building' is right: one of the entry's synonyms
  import sacrebleu

  single = sacrebleu.corpus_bleu(["building", "cat", "That is good."], [[t for _, t in pairs]]).score
  assert got["bleu_synonyms"] > single
