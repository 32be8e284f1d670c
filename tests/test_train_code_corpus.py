"""tools/train/code_corpus.py on made-up wheels (no Debian packages, no model):
- a FIM record is /infill's layout around a real middle: prefix + middle + suffix is a stretch of
  the source file, the middle ends in <|endoftext|>; a continuation's opening + continuation is one
  too, the continuation opening on a non-blank line;
- the split is by project: a project's records all on its side of the rule, both sides present;
- the newest wheel of a project is read, its version, sha256 and licence recorded; platform wheels,
  files spelling a special token and a file another package already gave are left out;
- train_files holds the training split's files only (a draft vocabulary's corpus);
- chat prompts quote a function of the file; a second run writes the same files.
Usage: test_train_code_corpus.py [tools/train dir]."""
import hashlib
import json
import pathlib
import subprocess
import sys
import tempfile
import zipfile

tool = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent.parent / "tools" / "train") / "code_corpus.py"
failures = []


def heldout(project, pct=50):
    return int(hashlib.sha256(("specula-code-split:" + project).encode()).hexdigest()[:8], 16) % 100 < pct


names = [f"proj{i}" for i in range(40)]
held = next(n for n in names if heldout(n))
kept = next(n for n in names if not heldout(n))


def source(name, k):
    lines = [f'"""Module {name} number {k}."""', "import os", ""]
    for f in range(6):
        lines += [f"def {name}_f{f}(a, b):", f'    """Add {f} to a and b."""', f"    total = a + b + {f}", "    if total > 10:",
                  "        total -= 1", "    return total", "", ""]
    return "\n".join(lines) + "\n"


def wheel(d, name, version, files, licence="MIT", tag="py3-none-any"):
    path = d / f"{name}-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}-{version}.dist-info/METADATA", f"Metadata-Version: 2.4\nName: {name}\nVersion: {version}\nLicense-Expression: {licence}\n\n")
        for n, text in files.items():
            z.writestr(n, text)
    return path


with tempfile.TemporaryDirectory() as tmp:
    d = pathlib.Path(tmp)
    wheels = d / "wheels"
    wheels.mkdir()
    texts = {f"{held}/a.py": source(held, 0), f"{held}/b.py": source(held, 1)}
    newest = wheel(wheels, held, "1.10", texts, "Apache-2.0")
    wheel(wheels, held, "1.9", {f"{held}/old.py": source(held, 9)})
    texts[f"{kept}/c.py"] = source(kept, 2)
    wheel(wheels, kept, "2.0", {f"{kept}/c.py": texts[f"{kept}/c.py"], f"{kept}/dup.py": texts[f"{held}/a.py"],
                                f"{kept}/special.py": source(kept, 3) + "x = '<|endoftext|>'\n"})
    wheel(wheels, "native", "1.0", {"native/n.py": source("native", 4)}, tag="cp311-cp311-linux_x86_64")
    run = lambda out: subprocess.run([sys.executable, str(tool), "--out", str(out), "--wheels", str(wheels), "--no-debian",
                                      "--heldout-pct", "50"], capture_output=True, text=True)
    r = run(d / "out")
    if r.returncode != 0:
        sys.exit(f"code_corpus.py failed: {r.stderr[-500:]}")
    out = d / "out"
    records = {k: [json.loads(l) for l in open(out / f"{k}.jsonl")] for k in ("fim_train", "fim_heldout", "cont_train", "cont_heldout")}
    paths = {rec["path"] for rs in records.values() for rec in rs}
    if paths != set(texts):
        failures.append(f"files read: {sorted(paths)}, want {sorted(texts)} (the newest wheel's, no special token, no duplicate)")
    for kind, rs in records.items():
        if not rs:
            failures.append(f"{kind}: no records")
        for rec in rs:
            want = "heldout" if rec["package"] == held else "train"
            if rec["split"] != want or not kind.endswith(want):
                failures.append(f"{kind}: {rec['package']} record in split {rec['split']}, want {want}")
            text = texts.get(rec["path"], "")
            if kind.startswith("fim"):
                p = rec["prompt"]
                if not (p.startswith("filename\n<|fim_prefix|>") and p.endswith("<|fim_middle|>") and rec["response"].endswith("<|endoftext|>")):
                    failures.append(f"{kind} {rec['index']}: not /infill's layout: {p[:40]!r}...{p[-20:]!r} {rec['response'][-20:]!r}")
                    continue
                prefix, suffix = p[len("filename\n<|fim_prefix|>"):-len("<|fim_middle|>")].split("<|fim_suffix|>")
                middle = rec["response"][:-len("<|endoftext|>")]
                if not middle.strip() or prefix + middle + suffix not in text:
                    failures.append(f"{kind} {rec['index']}: prefix + middle + suffix is not a stretch of {rec['path']}")
            else:
                if not rec["response"].split("\n")[0].strip() or rec["prompt"] + rec["response"] not in text:
                    failures.append(f"{kind} {rec['index']}: not a stretch of {rec['path']} continued at a non-blank line")
    kept_files = sorted(p.read_text() for p in (out / "train_files").rglob("*.py"))
    if kept_files != sorted([texts[f"{kept}/c.py"]]) or (out / "train_files" / held).exists():
        failures.append(f"train_files holds {len(kept_files)} files, want the training split's one (not the held-out project's)")
    licences = [l.rstrip("\n").split("\t") for l in open(out / "licences.tsv") if not l.startswith("#")]
    row = next((l for l in licences if l[0] == held), None)
    sha = hashlib.sha256(newest.read_bytes()).hexdigest()
    if row is None or row[2] != "1.10" or row[3] != "heldout" or row[6] != "Apache-2.0" or row[7] != sha:
        failures.append(f"licence row of {held}: {row}, want version 1.10, heldout, Apache-2.0, {sha}")
    if {l[0] for l in licences} != {held, kept}:
        failures.append(f"packages listed: {[l[0] for l in licences]}")
    prompts = json.load(open(out / "chat_prompts.json"))["prompts"]
    for p in prompts:
        if p["category"] not in ("explain", "complete", "review", "test", "document") or f"def {p['package']}_f" not in p["prompt"]:
            failures.append(f"chat prompt without a function of its file: {p['category']}: {p['prompt'][:80]!r}")
    if not prompts:
        failures.append("no chat prompts")
    if run(d / "again").returncode != 0 or any((out / n).read_bytes() != (d / "again" / n).read_bytes()
                                               for n in ("fim_train.jsonl", "cont_heldout.jsonl", "chat_prompts.json", "licences.tsv")):
        failures.append("a second run wrote other files")

if failures:
    sys.exit("\n".join(failures))
print("code corpus: FIM and continuation records are stretches of their files, split by project, licences recorded")
