#!/usr/bin/env python3
"""Build the specula training corpus from installed Debian packages.

Code  : CPython 3.11 stdlib + test suite *.py files (libpython3.11-minimal,
        libpython3.11-stdlib, libpython3.11-testsuite), taken from the dpkg file
        lists so only files owned by those packages are used.
Prose : python3.11-doc reST sources (html/_sources/**/*.rst.txt).

Split : held-out BY FILE: sha256("specula-split:" + path) -> first 8 hex digits
        as int; files with value % 100 < HELDOUT_PCT go to the held-out split.

Output (in --out): files_train.jsonl / files_heldout.jsonl (path, kind, package,
bytes) and corpus_meta.json (package versions, sizes, counts).
The texts themselves are re-read from the filesystem by later stages.
"""
import argparse, hashlib, json, os, subprocess, sys

CODE_PKGS = ["libpython3.11-minimal", "libpython3.11-stdlib", "libpython3.11-testsuite"]
DOC_PKGS = ["python3.11-doc"]
HELDOUT_PCT = 3


def pkg_list(pkg):
    for cand in (f"/var/lib/dpkg/info/{pkg}:amd64.list", f"/var/lib/dpkg/info/{pkg}.list"):
        if os.path.exists(cand):
            with open(cand) as f:
                return [l.rstrip("\n") for l in f]
    raise SystemExit(f"package {pkg} not installed (no dpkg list)")


def pkg_version(pkg):
    out = subprocess.run(["dpkg-query", "-W", "-f=${Package}\t${Version}\t${Architecture}\t${Installed-Size}", pkg],
                         capture_output=True, text=True, check=True).stdout.strip()
    name, ver, arch, isize = out.split("\t")
    return {"package": name, "version": ver, "architecture": arch, "installed_size_kib": int(isize)}


def is_heldout(path):
    h = int(hashlib.sha256(("specula-split:" + path).encode()).hexdigest()[:8], 16)
    return h % 100 < HELDOUT_PCT


def read_text(path):
    with open(path, "rb") as f:
        raw = f.read()
    try:
        txt = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None  # a few test files are intentionally not UTF-8; skipped
    if "\x00" in txt:
        return None
    return txt


def collect():
    files = []
    for pkg in CODE_PKGS:
        for p in pkg_list(pkg):
            if p.startswith("/usr/lib/python3.11/") and p.endswith(".py") and "/dist-packages/" not in p and os.path.isfile(p) and not os.path.islink(p):
                files.append((p, "code", pkg))
    for pkg in DOC_PKGS:
        for p in pkg_list(pkg):
            if "/_sources/" in p and p.endswith(".rst.txt") and os.path.isfile(p):
                files.append((p, "prose", pkg))
    # dpkg lists may contain a path more than once across packages; dedupe, keep first
    seen, out = set(), []
    for f in sorted(files):
        rp = os.path.realpath(f[0])
        if rp in seen:
            continue
        seen.add(rp)
        out.append(f)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    files = collect()
    stats = {}
    skipped = []
    with open(os.path.join(a.out, "files_train.jsonl"), "w") as ftr, open(os.path.join(a.out, "files_heldout.jsonl"), "w") as fho:
        for path, kind, pkg in files:
            txt = read_text(path)
            if txt is None or not txt.strip():
                skipped.append(path)
                continue
            split = "heldout" if is_heldout(path) else "train"
            rec = {"path": path, "kind": kind, "package": pkg, "bytes": len(txt.encode())}
            (fho if split == "heldout" else ftr).write(json.dumps(rec) + "\n")
            k = (pkg, kind, split)
            s = stats.setdefault("|".join(k), {"files": 0, "bytes": 0})
            s["files"] += 1
            s["bytes"] += rec["bytes"]
    meta = {
        "packages": [pkg_version(p) for p in CODE_PKGS + DOC_PKGS],
        "license": "PSF-2.0 (Python Software Foundation License; see /usr/share/doc/<package>/copyright)",
        "heldout_rule": f"sha256('specula-split:'+path)[:8] as int % 100 < {HELDOUT_PCT}",
        "stats": stats,
        "skipped_non_utf8_or_empty": skipped,
    }
    with open(os.path.join(a.out, "corpus_meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(json.dumps(meta["stats"], indent=1))
    print("skipped", len(skipped))


if __name__ == "__main__":
    main()
