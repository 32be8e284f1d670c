"""train_eagle.py's --feats FILE:N: the weight after the last ':' (a path may hold colons), weights of
a file named again add up and the file is listed once, a weight below 1 or not a whole number is
refused or kept as part of the path. Usage: test_train_feats_files.py [tools/train dir]."""
import pathlib
import sys

sys.path.insert(0, str(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent.parent / "tools" / "train"))
from feats_files import weighted_feats  # noqa: E402

failures = []


def check(what, got, want):
    if got != want:
        failures.append(f"{what}: got {got}, want {want}")


check("no weight", weighted_feats(["a.pt"]), [("a.pt", 1)])
check("a weight", weighted_feats(["a.pt:3", "b.pt"]), [("a.pt", 3), ("b.pt", 1)])
check("named twice: weights add, read once", weighted_feats(["a.pt", "b.pt:2", "a.pt:2"]), [("a.pt", 3), ("b.pt", 2)])
check("a colon in the path", weighted_feats(["/w/x:y/a.pt:2"]), [("/w/x:y/a.pt", 2)])
check("not a number after ':': part of the path", weighted_feats(["a.pt:x"]), [("a.pt:x", 1)])
for bad in ("a.pt:0", "a.pt:00"):
    try:
        weighted_feats([bad])
        failures.append(f"{bad}: accepted, want an error naming it")
    except ValueError as e:
        check(f"{bad}: the error names it", bad in str(e), True)

if failures:
    print("\n".join(failures))
    sys.exit(1)
print("feats_files: FILE:N weights add up per file, each file read once")
