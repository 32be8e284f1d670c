#!/usr/bin/env python3
"""Training text for a code target's drafter (Qwen2.5-Coder), from real source files that ship in
installed Debian packages and in the machine's cached PyPI wheels; the texts stay in --out (outside
git), the repository keeps this script, the manifest and the licence list.

Sources:
  Debian  every installed package's code files (dpkg file lists, /var/lib/dpkg/info/<pkg>.list;
          Python, C/C++, shell, Perl, JavaScript, ...), its version (dpkg-query) and the licences
          its /usr/share/doc/<pkg>/copyright names (DEP-5 "License:" fields);
  PyPI    pure-Python wheels in local wheel directories (--wheels; each wheel's sha256 recorded),
          one version per project, read from the zip, never installed: their *.py files, version
          and licence from the wheel's METADATA (License-Expression, License, licence classifiers).
A package's files are taken up to --files-per-package (chosen by a hash of the path), each 300 B to
100 KB of UTF-8 without NUL, not minified, and without text spelling a special token ("<|"); a file
whose content another package already gave is skipped.

Split: held out BY PROJECT: int(sha256("specula-code-split:" + project)[:8], 16) % 100 < --heldout-pct,
project = the wheel's normalized name, or the Debian package's name without a python3- prefix (so
a project shipped both ways lands on one side); packages owning files in the corpus of the draft
vocabulary models/qwen2.5-coder-draft-vocab.txt (/usr/include, the CPython 3.11 library) always
train, so held-out text is new to that list too.

Output (--out):
  fim_{train,heldout}.jsonl   fill-in-the-middle spans, in the layout `specula serve`'s /infill
                              renders at a 2048-token context: "filename\\n<|fim_prefix|>PREFIX
                              <|fim_suffix|>SUFFIX<|fim_middle|>" + the real middle and
                              <|endoftext|> (what the target emits after a middle): teacher-forced;
  cont_{train,heldout}.jsonl  file continuations: a file's opening lines, then the next lines
                              (raw text, as /v1/completions reads it): teacher-forced;
  chat_prompts.json           chat prompts about a real function (explain, complete, review, test,
                              document; generate_responses.py's prompt-set format), whose replies
                              the target writes itself;
  train_files/PACKAGE/*       the training split's files as read (`specula draft-vocab` counts a
                              draft vocabulary on them);
  manifest.json, licences.tsv the packages (source, version, sha256 of a wheel, licence, split,
                              files, bytes), the rule and the counts (copied into models/).
Records of the jsonl files have generate_responses.py's reply shape (index, category, split,
prompt, response) plus package, path and lang, so target_features.py --frame '{}' --teacher-forced
reads them as replies. Deterministic: the same machine state gives the same files.
  code_corpus.py --out WORK/corpus [--wheels DIR ...] [--files-per-package 24]"""
import argparse, ast, email.parser, glob, hashlib, json, os, random, re, subprocess, sys, zipfile

EXTENSIONS = {".py": "python", ".pyi": "python", ".c": "c", ".h": "c", ".cc": "cpp", ".cpp": "cpp", ".cxx": "cpp",
              ".hh": "cpp", ".hpp": "cpp", ".hxx": "cpp", ".sh": "bash", ".bash": "bash", ".pl": "perl", ".pm": "perl",
              ".js": "javascript", ".mjs": "javascript", ".ts": "typescript", ".go": "go", ".rs": "rust", ".rb": "ruby",
              ".lua": "lua", ".java": "java", ".tcl": "tcl", ".cmake": "cmake"}
LANG_NAMES = {"python": "Python", "c": "C", "cpp": "C++", "bash": "shell", "perl": "Perl", "javascript": "JavaScript",
              "typescript": "TypeScript", "go": "Go", "rust": "Rust", "ruby": "Ruby", "lua": "Lua", "java": "Java",
              "tcl": "Tcl", "cmake": "CMake"}
# Debian packages left out: vendored bundles of other projects' code (their own licences unlisted)
# and cross-architecture copies of headers already taken natively.
SKIP_DEB = re.compile(r"^google-cloud-cli|-cross$")
# the corpus the committed draft vocabulary was counted on (its header): these packages never hold out
VOCAB_CORPUS = ("/usr/include/", "/usr/lib/python3.11/")
FIM_HEAD = "filename\n<|fim_prefix|>"  # /infill's layout at -c 2048: the repo-level head cut to its last two tokens
FIM_END = "<|endoftext|>"
# the licences an unstructured (not DEP-5) copyright file is searched for, to name beside its path
UNSTRUCTURED_LICENCES = [("LGPL", r"GNU (Library|Lesser) General Public License"), ("GPL", r"GNU General Public License"),
                         ("PSF", r"Python Software Foundation License"), ("MIT/X11", r"Permission is hereby granted, free of charge"),
                         ("BSD", r"Redistribution and use in source and binary forms"), ("Apache", r"Apache License"),
                         ("Artistic", r"Artistic License"), ("public domain", r"public domain")]
CATEGORIES = ["explain", "complete", "review", "test", "document"]


def stable_hash(text):
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)


def project_of(source, name):
    if source == "wheel":
        return re.sub(r"[-_.]+", "-", name).lower()
    name = name.split(":")[0]
    if name.startswith("libpython3") or name.startswith("python3.11"):
        return "cpython"
    return re.sub(r"^python3-", "", name)


def usable_text(raw):
    """The file's text, or None: not UTF-8, NUL, special-token spellings, minified or generated."""
    if not 300 <= len(raw) <= 100_000:
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if "\x00" in text or "<|" in text or "|>" in text:
        return None
    lines = text.splitlines()
    if len(lines) < 8 or max(map(len, lines)) > 400 or len(text) / len(lines) > 100:
        return None
    return text


# ---------------------------------------------------------------------------------------- sources
def debian_packages(dpkg_info, doc_root):
    """[(package, [code file paths])] of every installed package with code files, by name."""
    out = []
    for lst in sorted(glob.glob(os.path.join(dpkg_info, "*.list"))):
        pkg = os.path.basename(lst)[:-5]
        if SKIP_DEB.search(pkg.split(":")[0]):
            continue
        paths = []
        for line in open(lst, errors="replace"):
            p = line.rstrip("\n")
            if os.path.splitext(p)[1] in EXTENSIONS and p.startswith("/usr/") and not p.startswith("/usr/share/doc/") \
                    and os.path.isfile(p) and not os.path.islink(p):
                paths.append(p)
        if paths:
            out.append((pkg, paths))
    return out


def debian_version(pkg):
    r = subprocess.run(["dpkg-query", "-W", "-f=${Version}", pkg], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else "unknown"


def debian_licence(doc_root, pkg):
    """The licences a DEP-5 copyright file names, in order; or where the unstructured text is."""
    path = os.path.join(doc_root, pkg.split(":")[0], "copyright")
    if not os.path.exists(path):
        return "unknown (no copyright file)"
    text = open(path, errors="replace").read()
    lines = text.splitlines()
    names = []
    if lines and lines[0].startswith("Format:"):  # machine-readable (DEP-5): its License fields' short names
        for line in lines:
            m = re.match(r"License:\s*(\S.*)$", line)
            name = m.group(1).strip() if m else ""
            if name and len(name.split()) <= 6 and name not in names:
                names.append(name)
    if names:
        return " | ".join(names)
    named = [name for name, pattern in UNSTRUCTURED_LICENCES if re.search(pattern, text, re.I)]
    return f"see {path}" + (f" (it names: {', '.join(named)})" if named else "")


def wheel_projects(dirs):
    """{project: (version, wheel path)} of the pure-Python wheels in dirs, the highest version of each."""
    best = {}
    for d in dirs:
        for path in sorted(glob.glob(os.path.join(d, "*.whl"))):
            parts = os.path.basename(path)[:-4].split("-")
            if len(parts) < 5 or parts[-1] != "any" or parts[-2] != "none" or not parts[-3].startswith("py"):
                continue
            name, version = project_of("wheel", parts[0]), parts[1]
            v = version_key(version)
            if name not in best or v > best[name][0]:
                best[name] = (v, path)
    return {k: (os.path.basename(p).split("-")[1], p) for k, (v, p) in sorted(best.items())}


def version_key(version):
    """A version's order, near enough for picking a project's newest wheel: its numbers, a
    pre-release (a, b, rc, dev) before the release."""
    nums = [int(n) for n in re.findall(r"\d+", version.split("+")[0])]
    return (nums[:4] + [0] * (4 - len(nums[:4])), 0 if re.search(r"(a|b|rc|dev)\d*", version) else 1, nums[4:])


def wheel_licence(meta_text):
    msg = email.parser.Parser().parsestr(meta_text, headersonly=True)
    if msg.get("License-Expression"):
        return msg["License-Expression"].strip()
    classifiers = [c.split("::")[-1].strip() for c in msg.get_all("Classifier") or [] if c.startswith("License ::")]
    lic = (msg.get("License") or "").strip()
    if lic and len(lic) <= 80 and "\n" not in lic and lic.upper() != "UNKNOWN":
        return lic
    if classifiers:
        return " | ".join(classifiers)
    return "unknown (no licence in METADATA)" if not lic or lic.upper() == "UNKNOWN" else "see the wheel's METADATA"


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# ------------------------------------------------------------------------------------------- items
def fim_span(text, rng):
    """(prefix, middle, suffix) of one span: whole lines (1-10) or the rest of a line and up to 3
    more (the cursor inside a line), with up to 2,000 characters of whole lines before and 800 after."""
    lines = text.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    candidates = [i for i, line in enumerate(lines) if line.strip() and i > 0]
    if not candidates:
        return None
    i = rng.choice(candidates)
    if rng.random() < 0.3:  # inside a line: from a character after its indentation
        line = lines[i].rstrip("\n")
        indent = len(line) - len(line.lstrip())
        if len(line) - indent < 4:
            return None
        a = starts[i] + rng.randrange(indent + 1, len(line))
        b = starts[i + 1 + min(rng.randrange(4), len(lines) - i - 1)] - 1
    else:
        a = starts[i]
        b = starts[min(i + rng.randint(1, 10), len(lines))]
    b = max(b, a + 1)
    if b - a > 800:
        b = text.rfind("\n", a, a + 800) + 1 or a + 800
    pre_lo = max(0, a - rng.randint(200, 2000))
    if pre_lo > 0:
        pre_lo = text.find("\n", pre_lo, a) + 1 or a
    suf_hi = min(len(text), b + rng.randint(0, 800))
    if suf_hi < len(text):
        suf_hi = text.rfind("\n", b, suf_hi) + 1 or b
    middle = text[a:b]
    if not middle.strip():
        return None
    return text[pre_lo:a], middle, text[b:suf_hi]


def continuation(text, rng):
    """(opening, continuation): the file's lines up to a non-blank line (200-1,500 characters of
    whole lines, or the file's start), then 500-2,000 characters of whole lines from it."""
    lines = text.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    cut_lo = [i for i in range(1, len(lines)) if lines[i].strip() and starts[i] >= 200]
    if not cut_lo:
        return None
    i = rng.choice(cut_lo[:max(1, len(cut_lo) // 2)])
    lo = max(0, starts[i] - rng.randint(200, 1500))
    if lo > 0:
        lo = text.find("\n", lo, starts[i]) + 1 or starts[i]
    hi = min(len(text), starts[i] + rng.randint(500, 2000))
    if hi < len(text):
        hi = text.rfind("\n", starts[i], hi) + 1 or hi
    if hi - starts[i] < 200:
        return None
    return text[lo:starts[i]], text[starts[i]:hi]


C_DEF = re.compile(r"^[A-Za-z_][\w \t\*&:<>,]*\([^;{}]*\)\s*(const\s*)?(\{\s*)?$")


def functions(text, lang):
    """Source of the functions of 4-60 lines (at most 2,500 characters) in a file."""
    out = []
    lines = text.splitlines(keepends=True)
    if lang == "python":
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            return []
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno:
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                src = "".join(lines[first - 1:node.end_lineno])
                out.append(src)
    elif lang in ("c", "cpp", "bash"):
        i = 0
        while i < len(lines):
            line = lines[i]
            opens = (lang == "bash" and re.match(r"^(function\s+)?[\w:-]+\s*\(\)\s*\{?\s*$", line)) or (lang != "bash" and C_DEF.match(line))
            if not opens:
                i += 1
                continue
            depth, j, seen = 0, i, False
            while j < len(lines) and j < i + 80:
                depth += lines[j].count("{") - lines[j].count("}")
                seen = seen or "{" in lines[j]
                if seen and depth <= 0:
                    break
                j += 1
            if seen and depth == 0 and j < len(lines):
                out.append("".join(lines[i:j + 1]))
                i = j + 1
            else:
                i += 1
    return [f for f in out if 4 <= f.count("\n") <= 60 and len(f) <= 2500]


def chat_prompt(fn, lang, category, rng):
    name, fence = LANG_NAMES[lang], lang
    code = fn.rstrip("\n")
    if category == "complete":
        body = code.split("\n")
        keep = max(1, min(len(body) - 2, int(len(body) * rng.uniform(0.25, 0.6))))
        return f"Complete the following {name} function:\n\n```{fence}\n" + "\n".join(body[:keep]) + "\n```"
    return {
        "explain": f"Explain what this {name} function does, step by step.\n\n```{fence}\n{code}\n```",
        "review": f"Review this {name} function: point out bugs, unhandled edge cases or unclear code, and show a fixed version.\n\n```{fence}\n{code}\n```",
        "test": f"Write unit tests for this {name} function.\n\n```{fence}\n{code}\n```",
        "document": f"Write documentation for this {name} function: a docstring or comment block, with its parameters and return value.\n\n```{fence}\n{code}\n```",
    }[category]


# -------------------------------------------------------------------------------------------- main
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--wheels", action="append", default=None,
                    help="a directory of cached wheels (repeatable; default /opt/pypi/files and /opt/pypi-more/files where present)")
    ap.add_argument("--dpkg-info", default="/var/lib/dpkg/info")
    ap.add_argument("--doc-root", default="/usr/share/doc")
    ap.add_argument("--files-per-package", type=int, default=24)
    ap.add_argument("--max-wheels", type=int, default=200, help="pure-Python wheels taken (by a hash of the project name)")
    ap.add_argument("--max-wheel-bytes", type=int, default=3_000_000, help="larger wheels are left out")
    ap.add_argument("--heldout-pct", type=int, default=10)
    ap.add_argument("--no-debian", action="store_true")
    a = ap.parse_args()
    wheel_dirs = a.wheels if a.wheels is not None else [d for d in ("/opt/pypi/files", "/opt/pypi-more/files") if os.path.isdir(d)]
    os.makedirs(a.out, exist_ok=True)

    def split_of(project, paths=()):
        if any(p.startswith(VOCAB_CORPUS) for p in paths):
            return "train"
        return "heldout" if stable_hash("specula-code-split:" + project) % 100 < a.heldout_pct else "train"

    packages = []  # (record, [(path, text)] loader)
    if not a.no_debian:
        for pkg, paths in debian_packages(a.dpkg_info, a.doc_root):
            project = project_of("deb", pkg)
            rec = {"package": pkg.split(":")[0], "dpkg": pkg, "source": "deb", "project": project, "split": split_of(project, paths)}

            def load(paths=paths):
                for p in sorted(paths, key=lambda p: stable_hash("file:" + p)):
                    with open(p, "rb") as f:
                        yield p, f.read()
            packages.append((rec, load))
    wheels = wheel_projects(wheel_dirs)
    chosen = sorted((w for w in wheels.items() if os.path.getsize(w[1][1]) <= a.max_wheel_bytes), key=lambda w: stable_hash("wheel:" + w[0]))
    for project, (version, path) in sorted(chosen[:a.max_wheels]):
        rec = {"package": project, "source": "wheel", "project": project, "version": version, "wheel": os.path.basename(path),
               "sha256": sha256_file(path), "split": split_of(project)}

        def load(path=path, rec=rec):
            with zipfile.ZipFile(path) as z:
                names = z.namelist()
                meta = [n for n in names if n.endswith(".dist-info/METADATA")]
                rec["licence"] = wheel_licence(z.read(meta[0]).decode("utf-8", "replace")) if meta else "unknown (no METADATA)"
                for n in sorted((n for n in names if n.endswith(".py")), key=lambda n: stable_hash("file:" + n)):
                    yield n, z.read(n)
        packages.append((rec, load))

    # held-out packages first: a file both sides ship stays held out
    packages.sort(key=lambda p: (p[0]["split"] != "heldout", p[0]["source"], p[0]["package"]))
    seen = set()
    outs = {(kind, split): open(os.path.join(a.out, f"{kind}_{split}.jsonl"), "w") for kind in ("fim", "cont") for split in ("train", "heldout")}
    counters = {k: 0 for k in outs}
    prompts, kept = [], []
    for rec, load in packages:
        files = bytes_ = 0
        for path, raw in load():
            if files >= a.files_per_package:
                break
            lang = EXTENSIONS.get(os.path.splitext(path)[1])
            text = usable_text(raw)
            if lang is None or text is None:
                continue
            digest = hashlib.sha256(raw).hexdigest()
            if digest in seen:
                continue
            seen.add(digest)
            if rec["split"] == "train":  # the training files themselves: the corpus a draft vocabulary is counted on
                keep = os.path.join(a.out, "train_files", rec["package"], f"{digest[:16]}{os.path.splitext(path)[1]}")
                os.makedirs(os.path.dirname(keep), exist_ok=True)
                with open(keep, "wb") as f:
                    f.write(raw)
            files += 1
            bytes_ += len(raw)
            rng = random.Random(stable_hash(f"{rec['package']}:{path}"))
            base = {"split": rec["split"], "package": rec["package"], "path": path, "lang": lang}
            for _ in range(2):
                span = fim_span(text, rng)
                if span:
                    prefix, middle, suffix = span
                    key = ("fim", rec["split"])
                    outs[key].write(json.dumps({"index": counters[key], "category": "fim", **base, "prompt": FIM_HEAD + prefix + "<|fim_suffix|>" + suffix + "<|fim_middle|>",
                                                "response": middle + FIM_END}) + "\n")
                    counters[key] += 1
            cont = continuation(text, rng)
            if cont:
                key = ("cont", rec["split"])
                outs[key].write(json.dumps({"index": counters[key], "category": "continuation", **base, "prompt": cont[0], "response": cont[1]}) + "\n")
                counters[key] += 1
            fns = functions(text, lang)
            if fns:
                category = CATEGORIES[stable_hash("category:" + path) % len(CATEGORIES)]
                prompts.append({"prompt": chat_prompt(rng.choice(fns), lang, category, rng), "category": category, **base})
        if files == 0:
            continue
        if rec["source"] == "deb":
            rec["version"] = debian_version(rec["dpkg"])
            rec["licence"] = debian_licence(a.doc_root, rec["dpkg"])
        rec.update(files=files, bytes=bytes_)
        kept.append(rec)
    for f in outs.values():
        f.close()
    with open(os.path.join(a.out, "chat_prompts.json"), "w") as f:
        json.dump({"prompts": prompts}, f, indent=0)

    def digest_of(name):
        return sha256_file(os.path.join(a.out, name))
    stats = {f"{kind}_{split}": n for (kind, split), n in counters.items()}
    for split in ("train", "heldout"):
        stats[f"chat_{split}"] = sum(p["split"] == split for p in prompts)
        stats[f"packages_{split}"] = sum(r["split"] == split for r in kept)
        stats[f"files_{split}"] = sum(r["files"] for r in kept if r["split"] == split)
        stats[f"bytes_{split}"] = sum(r["bytes"] for r in kept if r["split"] == split)
    manifest = {
        "generator": "tools/train/code_corpus.py",
        "settings": {"files_per_package": a.files_per_package, "max_wheels": a.max_wheels, "max_wheel_bytes": a.max_wheel_bytes,
                     "heldout_pct": a.heldout_pct, "wheel_dirs": wheel_dirs, "debian": not a.no_debian},
        "heldout_rule": f"int(sha256('specula-code-split:' + project)[:8], 16) % 100 < {a.heldout_pct}; packages owning files under "
                        f"{' or '.join(VOCAB_CORPUS)} always train",
        "fim_layout": FIM_HEAD.replace("\n", "\\n") + "PREFIX<|fim_suffix|>SUFFIX<|fim_middle|> + MIDDLE" + FIM_END,
        "counts": stats,
        "sha256": {n: digest_of(n) for n in sorted(os.listdir(a.out)) if n.endswith((".jsonl", ".json")) and n != "manifest.json"},
    }
    with open(os.path.join(a.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    with open(os.path.join(a.out, "licences.tsv"), "w") as f:
        f.write("# package\tsource\tversion\tsplit\tfiles\tbytes\tlicence\twheel sha256\n")
        for r in sorted(kept, key=lambda r: (r["source"], r["package"])):
            f.write("\t".join([r.get("dpkg", r["package"]), r["source"], r["version"], r["split"], str(r["files"]), str(r["bytes"]),
                               r["licence"].replace("\t", " "), r.get("sha256", "")]) + "\n")
    print(json.dumps(stats))


if __name__ == "__main__":
    main()
