"""Build the demo model's corpus, vocabulary and token arrays from Debian package metadata on this machine.

Nothing is downloaded. `apt-cache dumpavail` gives every package of the configured suites (name,
section, priority, one-line description, debtags, dependencies, homepage, size); /var/lib/dpkg/status
adds the long descriptions of the installed packages (this image's apt fetches no Translation files,
so the others have their one-line description only). Each package becomes chat turns (a question
about it, an answer assembled from its metadata) and a plain text record for language modelling.
Packages are split into train and test by a seeded hash of the name; well-known packages always
train, so the demo can answer about them.

Writes under --out (default .demo/, ignored by git): corpus/{train,test}.jsonl, vocab.json and
vocab.gguf (the vocabulary alone, for tokenizing), data/{train,test}.npy (uint16 token streams),
carry/{train,test}.npz (the same, zlib-compressed, for the GPU box) and stats.json (also in carry/).

    python3 -m scripts.demo.build_corpus [--out .demo] [--vocab 2048] [--seed 0]
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import random
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from runner.engine.tokenizer import Tokenizer
from runner.synth.vocab import build_vocab, write_vocab_only

ARCH = "glm4moe"
TEST_FRACTION = 0.02
# Always in the train split: the packages a fresh user asks about first.
WELL_KNOWN = ("bash", "coreutils", "python3", "openssh-server", "openssh-client", "vim", "git", "curl",
              "wget", "gcc", "make", "grep", "sed", "tar", "gzip", "apt", "dpkg", "perl", "nano", "emacs")
SYSTEM_PROMPT = "You are a helpful assistant that knows the Debian package archive."
# Conversations per package with a long description (they carry the archive's real prose).
LONG_DESC_CONVERSATIONS = 6

SECTIONS = {
    "admin": "system administration", "cli-mono": "Mono and .NET", "comm": "communication",
    "database": "databases", "debug": "debugging symbols", "devel": "software development",
    "doc": "documentation", "editors": "text editors", "education": "education",
    "electronics": "electronics", "embedded": "embedded systems", "fonts": "fonts", "games": "games",
    "gnome": "the GNOME desktop", "gnu-r": "GNU R", "gnustep": "GNUstep", "golang": "the Go language",
    "graphics": "graphics", "hamradio": "amateur radio", "haskell": "the Haskell language",
    "httpd": "web servers", "interpreters": "interpreters", "introspection": "GObject introspection",
    "java": "the Java language", "javascript": "JavaScript", "kde": "the KDE desktop",
    "kernel": "the kernel", "libdevel": "library development files", "libs": "libraries",
    "lisp": "the Lisp language", "localization": "localization", "mail": "email", "math": "mathematics",
    "metapackages": "metapackages", "misc": "miscellaneous software", "net": "networking",
    "news": "Usenet news", "ocaml": "the OCaml language", "oldlibs": "old libraries",
    "otherosfs": "other operating systems and file systems", "perl": "the Perl language",
    "php": "the PHP language", "python": "the Python language", "ruby": "the Ruby language",
    "rust": "the Rust language", "science": "science", "shells": "command shells", "sound": "sound",
    "tasks": "tasks", "tex": "the TeX typesetting system", "text": "text processing",
    "utils": "utilities", "vcs": "version control", "video": "video", "web": "the web",
    "x11": "the X Window System", "xfce": "the Xfce desktop", "zope": "Zope",
}
LANGUAGES = {"c": "C", "c++": "C++", "perl": "Perl", "python": "Python", "java": "Java", "lisp": "Lisp",
             "ruby": "Ruby", "shell": "shell script", "haskell": "Haskell", "ocaml": "OCaml", "php": "PHP",
             "tcl": "Tcl", "ecmascript": "JavaScript", "lua": "Lua", "vala": "Vala", "fortran": "Fortran",
             "go": "Go", "rust": "Rust", "c-sharp": "C#", "r": "R", "scheme": "Scheme", "erlang": "Erlang"}
TAG_SENTENCES = {
    "role::program": "It is a program.", "role::shared-lib": "It is a shared library.",
    "role::devel-lib": "It holds the development files of a library.",
    "role::documentation": "It holds documentation.", "role::plugin": "It is a plugin.",
    "role::metapackage": "It is a metapackage that pulls in other packages.",
    "role::app-data": "It holds data files for an application.", "role::data": "It holds data files.",
    "interface::commandline": "It is used from the command line.",
    "interface::x11": "It has a graphical interface.", "interface::graphical": "It has a graphical interface.",
    "interface::text-mode": "It has a text-mode interface.", "interface::shell": "It is a command shell.",
    "interface::daemon": "It runs as a daemon, a background service.",
    "network::server": "It is a network server.", "network::client": "It is a network client.",
    "suite::gnu": "It is part of the GNU project.", "uitoolkit::gtk": "It uses the GTK toolkit.",
    "uitoolkit::qt": "It uses the Qt toolkit.", "uitoolkit::ncurses": "It uses the ncurses library.",
    "use::gameplaying": "It is a game.", "use::editing": "It is used for editing.",
    "use::converting": "It converts between formats.", "use::viewing": "It is used for viewing files.",
    "use::monitor": "It is used for monitoring.", "use::checking": "It is used for checking things.",
    "use::configuring": "It is used for configuration.", "works-with::text": "It works with text.",
    "works-with::image": "It works with images.", "works-with::audio": "It works with audio.",
    "works-with::mail": "It works with email.", "works-with::db": "It works with databases.",
    "security::authentication": "It deals with authentication.",
}


@dataclass(frozen=True)
class Package:
    name: str
    section: str
    priority: str
    short: str
    long: str | None
    source: str
    version: str
    depends: tuple[str, ...]
    homepage: str | None
    tags: tuple[str, ...]
    essential: bool
    installed_kb: int


def stanzas(text: str) -> list[dict[str, str]]:
    """Debian control stanzas: fields with their continuation lines joined by newlines."""
    out = []
    for block in text.split("\n\n"):
        fields: dict[str, str] = {}
        key = None
        for line in block.splitlines():
            if line[:1] in (" ", "\t") and key:
                fields[key] += "\n" + line[1:]
            elif ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        if "Package" in fields:
            out.append(fields)
    return out


def long_description(field: str) -> str | None:
    """The extended description as paragraphs of plain text (" ." lines separate paragraphs)."""
    lines = field.split("\n")[1:]
    if not lines:
        return None
    paragraphs, current = [], []
    for line in lines:
        if line.strip() == ".":
            paragraphs.append(" ".join(current))
            current = []
        else:
            current.append(line.strip())
    paragraphs.append(" ".join(current))
    text = "\n".join(re.sub(r"\s+", " ", p).strip() for p in paragraphs if p.strip())
    return text or None


def dependency_names(*fields: str) -> tuple[str, ...]:
    names: list[str] = []
    for field in fields:
        for clause in field.split(","):
            name = clause.split("|")[0].split("(")[0].split(":")[0].strip()
            if name and not name.startswith("$") and name not in names:
                names.append(name)
    return tuple(names)


def load_packages(dumpavail: str, status: str) -> list[Package]:
    longs = {s["Package"]: long_description(s.get("Description", "")) for s in stanzas(status)}
    found: dict[str, Package] = {}
    for s in stanzas(dumpavail):
        name, desc = s["Package"], s.get("Description", "").split("\n")[0].strip()
        if not desc:
            continue
        found[name] = Package(  # later stanzas (bookworm-updates, security) replace earlier ones
            name=name, section=s.get("Section", "misc").split("/")[-1], priority=s.get("Priority", "optional"),
            short=desc, long=longs.get(name), source=s.get("Source", name).split(" ")[0],
            version=s.get("Version", ""), depends=dependency_names(s.get("Pre-Depends", ""), s.get("Depends", "")),
            homepage=s.get("Homepage"), tags=tuple(t.strip() for t in s.get("Tag", "").replace("\n", " ").split(",") if t.strip()),
            essential=s.get("Essential") == "yes", installed_kb=int(s.get("Installed-Size", "0") or 0),
        )
    return [found[n] for n in sorted(found)]


def in_test(name: str, seed: int) -> bool:
    if name in WELL_KNOWN:
        return False
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") / 2**64 < TEST_FRACTION


# -- sentences ------------------------------------------------------------------------------------
def listing(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def size_text(kb: int) -> str:
    return f"{kb} kB" if kb < 1024 else f"{kb / 1024:.1f} MB"


def section_sentence(p: Package) -> str:
    where = SECTIONS.get(p.section)
    text = f"It is in the {p.section} section" + (f" ({where})" if where else "") + f", with {p.priority} priority."
    return text + (" It is essential: every Debian system has it." if p.essential else "")


def tag_sentences(p: Package, limit: int = 3) -> list[str]:
    out: list[str] = []
    for tag in p.tags:
        lang = LANGUAGES.get(tag.removeprefix("implemented-in::")) if tag.startswith("implemented-in::") else None
        sentence = f"It is written in {lang}." if lang else TAG_SENTENCES.get(tag)
        if sentence and sentence not in out:
            out.append(sentence)
    return out[:limit]


def depends_sentence(p: Package) -> str:
    if not p.depends:
        return f"{p.name} does not depend on other packages."
    more = len(p.depends) - 4
    names = list(p.depends[:4]) + ([f"{more} more"] if more > 0 else [])
    return f"{p.name} depends on {listing(names)}."


def about(p: Package) -> str:
    facts = [section_sentence(p), *tag_sentences(p)] + ([f"Homepage: {p.homepage}"] if p.homepage else [])
    return "\n".join([f"{p.name}: {p.short}.", *([p.long] if p.long else []), " ".join(facts)])


def does(p: Package) -> str:
    tags = " ".join(tag_sentences(p, 2))
    return "\n".join([f"{p.name} provides {p.short}.", *([p.long] if p.long else []), *([tags] if tags else [])])


QUESTIONS = {
    "about": (["What is the package {n}?", "Tell me about {n}.", "What is {n}?", "Describe the package {n}."], about),
    "does": (["What does {n} do?", "What is {n} for?", "What does the package {n} provide?"], does),
    "section": (["Which section is {n} in?", "What section and priority does {n} have?"],
                lambda p: f"{p.name} is in the {p.section} section" +
                (f" ({SECTIONS[p.section]})" if p.section in SECTIONS else "") + f". Its priority is {p.priority}."),
    "depends": (["What does {n} depend on?", "Which packages does {n} need?"], depends_sentence),
    "homepage": (["What is the homepage of {n}?", "Where is the website of {n}?"],
                 lambda p: f"The homepage of {p.name} is {p.homepage}." if p.homepage else f"{p.name} has no homepage listed."),
    "source": (["Which source package builds {n}?", "What version of {n} is in Debian?"],
               lambda p: f"{p.name} is built from the source package {p.source}, version {p.version}."),
    "install": (["How do I install {n}?", "How can I get {n}?"],
                lambda p: f"Run: sudo apt install {p.name}\nIt takes about {size_text(p.installed_kb)} of disk space."),
}
KIND_WEIGHTS = {"about": 4, "does": 4, "section": 1, "depends": 1, "homepage": 1, "source": 1, "install": 1}


def conversation(p: Package, rng: random.Random, turns: int) -> list[dict[str, str]]:
    kinds = rng.sample(list(KIND_WEIGHTS), k=turns, counts=list(KIND_WEIGHTS.values()))
    messages = [{"role": "system", "content": SYSTEM_PROMPT}] if rng.random() < 0.15 else []
    for kind in dict.fromkeys(kinds):  # no question twice
        phrasings, answer = QUESTIONS[kind]
        messages.append({"role": "user", "content": rng.choice(phrasings).format(n=p.name)})
        messages.append({"role": "assistant", "content": answer(p)})
    return messages


def plain_record(p: Package) -> str:
    lines = [f"Package: {p.name} ({p.section}, {p.priority})", f"{p.name}: {p.short}."]
    if p.long:
        lines.append(p.long)
    lines.append(depends_sentence(p))
    return "\n".join(lines)


def documents(packages: list[Package], seed: int) -> list[dict]:
    docs = []
    for p in packages:
        rng = random.Random(f"{seed}:{p.name}")
        n_conv = LONG_DESC_CONVERSATIONS if p.long else 1
        for _ in range(n_conv):
            docs.append({"pkg": p.name, "kind": "chat", "messages": conversation(p, rng, rng.choice((1, 2, 2, 3)))})
        docs.append({"pkg": p.name, "kind": "text", "text": plain_record(p)})
    random.Random(seed).shuffle(docs)
    return docs


def bpe_text(docs: list[dict]) -> str:
    """The corpus as plain text for learning merges: contents only, no chat markup."""
    pieces = []
    for d in docs:
        pieces += [m["content"] for m in d["messages"]] if d["kind"] == "chat" else [d["text"]]
    return "\n".join(pieces)


def render(tok: Tokenizer, doc: dict) -> str:
    """A document as the model sees it: chats in the model's own template, ended by <|user|> (end of turn)."""
    if doc["kind"] == "chat":
        return tok.render_chat(doc["messages"], add_generation_prompt=False) + "<|user|>"
    return doc["text"] + "<|endoftext|>"


def write_vocab_files(folder: Path, corpus: str, n_vocab: int) -> Path:
    """vocab.json (the VocabSpec, which export_demo.py writes into the model) and vocab.gguf (for tokenizing)."""
    spec = build_vocab(ARCH, n_vocab, corpus=corpus)
    (folder / "vocab.json").write_text(json.dumps(dataclasses.asdict(spec)) + "\n")
    return write_vocab_only(folder / "vocab.gguf", ARCH, spec)


def tokens_of(tok: Tokenizer, docs: list[dict]) -> np.ndarray:
    ids = [t for d in docs for t in tok.encode(render(tok, d), parse_special=True)]
    return np.asarray(ids, dtype=np.uint16)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(".demo"))
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dumpavail", type=Path, help="a saved `apt-cache dumpavail` (default: run it)")
    ap.add_argument("--status", type=Path, default=Path("/var/lib/dpkg/status"))
    args = ap.parse_args()

    dump = args.dumpavail.read_text() if args.dumpavail else subprocess.run(
        ["apt-cache", "dumpavail"], check=True, capture_output=True, text=True).stdout
    packages = load_packages(dump, args.status.read_text())
    split = {"train": [p for p in packages if not in_test(p.name, args.seed)],
             "test": [p for p in packages if in_test(p.name, args.seed)]}
    docs = {name: documents(ps, args.seed) for name, ps in split.items()}
    (args.out / "corpus").mkdir(parents=True, exist_ok=True)
    (args.out / "data").mkdir(exist_ok=True)
    (args.out / "carry").mkdir(exist_ok=True)
    for name, ds in docs.items():
        with open(args.out / "corpus" / f"{name}.jsonl", "w") as f:
            f.writelines(json.dumps(d) + "\n" for d in ds)

    vocab_path = write_vocab_files(args.out, bpe_text(docs["train"]), args.vocab)
    tok = Tokenizer(vocab_path)
    # export_demo.py checks the training run saw tokens of this very vocabulary.
    vocab_sha256 = hashlib.sha256((args.out / "vocab.json").read_bytes()).hexdigest()
    stats: dict = {"packages": len(packages), "with_long_description": sum(p.long is not None for p in packages),
                   "vocab": tok.n_vocab, "vocab_sha256": vocab_sha256, "seed": args.seed,
                   # The inputs, so a rebuild on another machine can tell whether it read the same archive.
                   "dumpavail_sha256": hashlib.sha256(dump.encode()).hexdigest()}
    for name, ds in docs.items():
        ids = tokens_of(tok, ds)
        np.save(args.out / "data" / f"{name}.npy", ids)
        np.savez_compressed(args.out / "carry" / f"{name}.npz", tokens=ids)  # zlib: no lzma needed on the box
        chars = sum(len(render(tok, d)) for d in ds)
        stats[name] = {"packages": len(split[name]), "documents": len(ds), "chars": chars, "tokens": int(ids.size),
                       "chars_per_token": round(chars / ids.size, 3)}
    for folder in (args.out, args.out / "carry"):  # the training run records which data it saw
        (folder / "stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    print(json.dumps(stats, indent=2))


if __name__ == "__main__":
    main()
