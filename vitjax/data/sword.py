"""A small reader for SWORD ``zText`` Bible modules (no libsword needed).

Debian ships public-domain Bibles as SWORD modules, e.g. ``sword-text-kjv``
(``engKJV2006eb``) and ``sword-text-sparv`` (``spaRV1909eb``), under
``/usr/share/sword``. A module is described by ``mods.d/<name>.conf`` (INI-like:
``[ModuleName]`` then ``Key=Value`` lines); its ``DataPath`` (relative to the
library root, the folder holding ``mods.d``) contains, for each testament
``ot`` and ``nt``, three files (all integers little-endian):

* ``.bzs`` block index: 12 bytes per block, ``uint32 offset, uint32
  compressed_size, uint32 uncompressed_size`` of the block in ``.bzz``.
* ``.bzv`` verse index: 10 bytes per entry (``zText``; 12 for ``zText4``),
  ``uint32 block, uint32 offset, uint16 size`` (``uint32`` size for
  ``zText4``): the entry's bytes are ``size`` bytes at ``offset`` in the
  *decompressed* block ``block``. ``size == 0`` means an empty entry.
* ``.bzz`` the blocks, each compressed on its own (``CompressType=ZIP``: a zlib
  stream; ``BZIP2`` and ``XZ`` are also read; ``LZSS`` is not supported).

The verse index has one entry per position of the module's versification, in
canonical order: entry 0 (module header) and 1 (testament header), then per
book one book-heading entry, then per chapter a chapter-heading entry followed
by that chapter's verses. For the KJV versification that is 24,115 OT entries
(23,145 verses + 929 chapters + 39 books + 2) and 8,246 NT entries (7,957 +
260 + 27 + 2): 32,361 in all, the same for every module with
``Versification=KJV``, so entry ``i`` of two such modules is the same verse.

Entries hold marked-up text (``SourceType``: OSIS, ThML or GBF);
:func:`strip_markup` turns it into plain text.
"""

from __future__ import annotations

import bz2
import dataclasses
import glob
import html
import lzma
import os
import re
import struct
import zlib

#: Where SWORD libraries are looked for (plus ``$SWORD_PATH``, first).
DEFAULT_SWORD_DIRS = ("/usr/share/sword", "/usr/local/share/sword", "~/.sword")

TESTAMENTS = ("ot", "nt")


class ModuleNotFoundInLibraryError(FileNotFoundError):
  """No conf file for the module in any SWORD library searched."""


@dataclasses.dataclass(frozen=True)
class ModuleConf:
  """The parts of a module's ``.conf`` file that the reader needs.

  Attributes:
    name: module name (the ``[section]`` of the conf file).
    conf_path: the conf file.
    data_path: absolute folder with the ``ot.*``/``nt.*`` files.
    mod_drv: ``ModDrv`` (``zText`` or ``zText4`` are read).
    source_type: markup, ``OSIS`` / ``ThML`` / ``GBF`` / ``Plaintext``.
    encoding: ``UTF-8`` or ``Latin-1`` (SWORD's default when absent).
    compress_type: ``ZIP`` (default), ``BZIP2``, ``XZ`` or ``LZSS``.
    versification: ``Versification`` (default ``KJV``).
    lang: ``Lang`` (``''`` when absent).
    entries: every ``Key=Value`` of the section (first value of repeated keys).
  """

  name: str
  conf_path: str
  data_path: str
  mod_drv: str
  source_type: str
  encoding: str
  compress_type: str
  versification: str
  lang: str
  entries: dict


def sword_dirs() -> list[str]:
  """SWORD library roots searched: ``$SWORD_PATH`` then the defaults."""
  dirs = []
  if os.environ.get("SWORD_PATH"):
    dirs.extend(os.environ["SWORD_PATH"].split(os.pathsep))
  dirs.extend(DEFAULT_SWORD_DIRS)
  return [os.path.expanduser(d) for d in dirs]


def parse_conf(path: str) -> dict[str, dict[str, str]]:
  """Parses a SWORD conf file into ``{section: {key: first value}}``.

  Handles ``#`` comments, repeated keys (first kept) and values continued on
  the next line by a trailing backslash.
  """
  sections: dict[str, dict[str, str]] = {}
  current = None
  with open(path, encoding="utf-8", errors="replace") as f:
    lines = f.read().splitlines()
  i = 0
  while i < len(lines):
    line = lines[i].strip()
    i += 1
    if not line or line.startswith("#"):
      continue
    if line.startswith("[") and line.endswith("]"):
      current = sections.setdefault(line[1:-1].strip(), {})
      continue
    if current is None or "=" not in line:
      continue
    key, value = line.split("=", 1)
    while value.endswith("\\") and i < len(lines):  # continuation line
      value = value[:-1] + lines[i].strip()
      i += 1
    current.setdefault(key.strip(), value.strip())
  return sections


def find_module(name: str, dirs: list[str] | None = None) -> ModuleConf:
  """Finds module ``name`` (case-insensitive) in the SWORD libraries ``dirs``.

  Raises:
    ModuleNotFoundInLibraryError: no ``mods.d/*.conf`` declares the module.
  """
  dirs = [os.path.expanduser(d) for d in (dirs or sword_dirs())]
  for root in dirs:
    for conf_path in sorted(glob.glob(os.path.join(root, "mods.d", "*.conf"))):
      for section, entries in parse_conf(conf_path).items():
        if section.lower() != name.lower():
          continue
        data_path = entries.get("DataPath", "")
        data_path = os.path.normpath(os.path.join(root, data_path))
        encoding = entries.get("Encoding", "Latin-1")
        return ModuleConf(
          name=section,
          conf_path=conf_path,
          data_path=data_path,
          mod_drv=entries.get("ModDrv", ""),
          source_type=entries.get("SourceType", "Plaintext"),
          encoding="UTF-8" if encoding.upper().replace("-", "") == "UTF8" else encoding,
          compress_type=entries.get("CompressType", "ZIP").upper(),
          versification=entries.get("Versification", "KJV"),
          lang=entries.get("Lang", ""),
          entries=entries,
        )
  raise ModuleNotFoundInLibraryError(f"SWORD module '{name}' not found (searched {dirs} for mods.d/*.conf).")


def _decompress(data: bytes, compress_type: str) -> bytes:
  if compress_type == "ZIP":
    return zlib.decompress(data)
  if compress_type == "BZIP2":
    return bz2.decompress(data)
  if compress_type == "XZ":
    return lzma.decompress(data)
  raise NotImplementedError(f"SWORD CompressType={compress_type} is not supported (ZIP, BZIP2, XZ are).")


def read_testament(prefix: str, compress_type: str = "ZIP", mod_drv: str = "zText") -> list[bytes]:
  """Raw bytes of every verse-index entry of one testament.

  Args:
    prefix: path without extension, e.g. ``.../engKJV2006eb/ot``.
    compress_type: the conf's ``CompressType``.
    mod_drv: ``zText`` (10-byte verse entries) or ``zText4`` (12-byte).

  Returns:
    One ``bytes`` per ``.bzv`` entry, in index order (``b''`` when empty); an
    empty list when the testament's files are absent.
  """
  if not os.path.exists(prefix + ".bzv"):
    return []
  with open(prefix + ".bzs", "rb") as f:
    bzs = f.read()
  with open(prefix + ".bzv", "rb") as f:
    bzv = f.read()
  with open(prefix + ".bzz", "rb") as f:
    bzz = f.read()
  if len(bzs) % 12:
    raise ValueError(f"{prefix}.bzs: size {len(bzs)} is not a multiple of 12")
  blocks = list(struct.iter_unpack("<III", bzs))
  fmt = "<III" if mod_drv.lower() == "ztext4" else "<IIH"
  width = struct.calcsize(fmt)
  if len(bzv) % width:
    raise ValueError(f"{prefix}.bzv: size {len(bzv)} is not a multiple of {width} ({mod_drv})")
  cache: dict[int, bytes] = {}
  out = []
  for block, offset, size in struct.iter_unpack(fmt, bzv):
    if size == 0:
      out.append(b"")
      continue
    if block not in cache:
      start, csize, usize = blocks[block]
      raw = _decompress(bzz[start : start + csize], compress_type)
      if len(raw) != usize:
        raise ValueError(f"{prefix}.bzz block {block}: {len(raw)} bytes after decompression, index says {usize}")
      cache[block] = raw
    raw = cache[block]
    if offset + size > len(raw):
      raise ValueError(f"{prefix}.bzv: entry past the end of block {block}")
    out.append(raw[offset : offset + size])
  return out


def read_entries(conf: ModuleConf) -> list[str]:
  """Decoded (marked-up) text of every index entry, OT then NT."""
  if conf.mod_drv.lower() not in ("ztext", "ztext4"):
    raise NotImplementedError(f"Module {conf.name}: ModDrv={conf.mod_drv}; only zText / zText4 are read.")
  if conf.entries.get("CipherKey"):
    raise ValueError(f"Module {conf.name} is enciphered (CipherKey).")
  encoding = "utf-8" if conf.encoding == "UTF-8" else "latin-1"
  out = []
  for testament in TESTAMENTS:
    for raw in read_testament(os.path.join(conf.data_path, testament), conf.compress_type, conf.mod_drv):
      out.append(raw.decode(encoding, errors="replace"))
  return out


# ----------------------------------------------------------------------------
# Markup.

# Elements removed together with their content.
_DROP_WITH_CONTENT = [
  re.compile(r"<note\b[^>]*(?<!/)>.*?</note\s*>", re.S | re.I),  # OSIS/ThML
  re.compile(r"<RF[^>]*>.*?<Rf>", re.S),  # GBF notes
  re.compile(r"<TS[^>]*>.*?<Ts>", re.S),  # GBF titles
  re.compile(r"<(scripRef|reference)\b[^>]*(?<!/)>.*?</\1\s*>", re.S),
]
# OSIS titles: canonical ones (psalm superscriptions) are verse text, the
# others (book names, section headings, acrostic letters) are dropped.
_TITLE = re.compile(r"<title\b([^>]*)(?<!/)>(.*?)</title\s*>", re.S)
# Tags that separate words (their removal leaves a space); others leave none.
_BLOCK_TAGS = re.compile(
  r"</?(l|lb|lg|p|br|div|chapter|verse|milestone|title|list|item|table|row|"
  r"cell|CM|CL|PF\d?|PI\d?)\b[^>]*>",
  re.I,
)
_ANY_TAG = re.compile(r"<[^<>]*>")
_USFM = re.compile(r"\\\+?[a-z]+\d*\*?")  # stray USFM markers, e.g. \nd \+nd*
_PILCROW = "\u00b6"


def strip_markup(text: str) -> str:
  r"""Plain text of a marked-up verse (OSIS, ThML or GBF).

  Drops notes (``<note>``, GBF ``<RF>..<Rf>``) and cross references with their
  content, drops non-canonical ``<title>`` headings with their content (keeps
  the text of ``canonical="true"`` titles, i.e. psalm superscriptions, which
  other translations have as verse text), removes every other tag but keeps
  its text (``<w lemma="strong:...">``, ``<transChange>``, ``<divineName>``,
  ``<q>``, ...; Strong's numbers live in attributes or GBF ``<WH..>`` tags, so
  they go with them), removes stray USFM markers (``\nd``) and the pilcrow
  paragraph sign, decodes entities (``&amp;``) and normalises whitespace.
  """
  for pattern in _DROP_WITH_CONTENT:
    text = pattern.sub(" ", text)
  text = _TITLE.sub(lambda m: f" {m.group(2)} " if 'canonical="true"' in m.group(1) else " ", text)
  text = _BLOCK_TAGS.sub(" ", text)
  text = _ANY_TAG.sub("", text)
  text = _USFM.sub("", text)
  text = html.unescape(text).replace(_PILCROW, " ")
  return " ".join(text.split())


_BOOK_START = re.compile(r'<div\b(?=[^>]*\btype="book")(?![^>]*\beID=)[^>]*\bosisID="([^"]+)"')
_CHAPTER_START = re.compile(r'<chapter\b(?=[^>]*\bsID=)[^>]*\bosisID="[^"]*?\.(\d+)"')


def references(entries: list[str]) -> list[str | None]:
  """The OSIS reference ("Gen.1.1") of each marked-up entry of an OSIS module (``read_module(plain=False)``).

  None for the module, testament, book and chapter headings: a book heading opens ``<div type="book" osisID="Gen">``, a
  chapter heading ``<chapter sID=... osisID="Gen.1">``, and the entries after a chapter heading are its verses 1, 2, ...
  until the next heading.
  """
  refs: list[str | None] = []
  book, chapter, verse = None, None, 0
  for entry in entries:
    opened, started = _BOOK_START.search(entry), _CHAPTER_START.search(entry)
    if opened or "x-importer" in entry or not (book or started):  # a book or testament heading
      if "x-importer" in entry and refs:  # a testament's header: the entry before it is the module's header
        refs[-1] = None
      book, chapter = (opened.group(1) if opened else None), None
      refs.append(None)
    elif started:
      chapter, verse = int(started.group(1)), 0
      refs.append(None)
    elif chapter is None:
      refs.append(None)
    else:
      verse += 1
      refs.append(f"{book}.{chapter}.{verse}")
  return refs


def read_module(name: str, dirs: list[str] | None = None, *, plain: bool = True) -> tuple[ModuleConf, list[str]]:
  """Reads every entry of a zText module, in verse-index order.

  Args:
    name: module name, e.g. ``'engKJV2006eb'``.
    dirs: SWORD library roots (default :func:`sword_dirs`).
    plain: strip markup with :func:`strip_markup` (else raw entry text).

  Returns:
    (conf, entries): one string per index entry, headings and empty entries
    included (``''``), so that equal versifications align by position.
  """
  conf = find_module(name, dirs)
  entries = read_entries(conf)
  if plain:
    entries = [strip_markup(e) for e in entries]
  return conf, entries
