"""The ShareGPT replies kept in git round-trip: pack keeps only the target's own replies (no prompt
text of the dataset), unpack joins them with the prompt set into the same files, with --limit N
only the replies to the first N training prompts in reply order (and the held-out ones whole), and
refuses a prompt set the replies do not index or a work directory that has them already.
Usage: test_train_sharegpt_replies.py [tools/train dir]."""
import gzip
import json
import os
import pathlib
import subprocess
import sys
import tempfile

tool = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent.parent / "tools" / "train") / "sharegpt_replies.py"
failures = []
with tempfile.TemporaryDirectory() as d:
    prompts = [{"category": "qa", "conversation": "a1", "turn": 0, "prompt": "What is a tide?", "split": "train"},
               {"category": "multi_turn", "conversation": "a1", "turn": 1, "prompt": "And why?", "split": "heldout",
                "context": [{"role": "user", "content": "What is a tide?"}, {"role": "assistant", "content": "Water."}]},
               {"category": "code", "conversation": "b1", "turn": 0, "prompt": "Sort a list.", "split": "train"}]
    json.dump({"about": "test", "prompts": prompts}, open(f"{d}/prompts.json", "w"))
    gen = [dict(prompts[0], index=0, temp=0.0, frame=None, response="The sea rises."),
           dict(prompts[2], index=2, temp=0.0, frame=None, response="sorted(xs)")]
    held = [dict(prompts[1], index=1, temp=0.0, frame=None, response="The moon.")]
    for name, recs in (("gen_0_1.jsonl", gen), ("heldout_0_1.jsonl", held)):
        with open(f"{d}/{name}", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in recs)
    run = lambda *args: subprocess.run([sys.executable, str(tool), *args], capture_output=True, text=True)
    r = run("pack", "--gen", f"{d}/gen_0_1.jsonl", "--gen", f"{d}/heldout_0_1.jsonl", "--out", f"{d}/replies.jsonl.gz")
    if r.returncode:
        failures.append(f"pack failed: {r.stderr}")
    packed = gzip.open(f"{d}/replies.jsonl.gz", "rt").read()
    if "tide" in packed or "And why" in packed:
        failures.append("pack kept the dataset's prompt text")
    r = run("unpack", "--replies", f"{d}/replies.jsonl.gz", "--prompts", f"{d}/prompts.json", "--work", f"{d}/w")
    if r.returncode:
        failures.append(f"unpack failed: {r.stderr}")
    for name, recs in (("gen_0_1.jsonl", gen), ("heldout_0_1.jsonl", held)):
        got = [json.loads(l) for l in open(f"{d}/w/{name}")] if os.path.exists(f"{d}/w/{name}") else None
        if got != recs:
            failures.append(f"{name}: unpacked {got}, packed {recs}")
    r = run("unpack", "--replies", f"{d}/replies.jsonl.gz", "--prompts", f"{d}/prompts.json", "--work", f"{d}/w")
    if r.returncode == 0 or "fresh work directory" not in r.stderr:
        failures.append(f"unpack over existing files: exit {r.returncode}, {r.stderr!r}")
    # reply order: the held-out prompt 1, then the categories round-robin (qa's 0, code's 2)
    r = run("unpack", "--replies", f"{d}/replies.jsonl.gz", "--prompts", f"{d}/prompts.json", "--work", f"{d}/w1", "--limit", "1")
    if r.returncode:
        failures.append(f"unpack --limit 1 failed: {r.stderr}")
    for name, recs in (("gen_0_1.jsonl", gen[:1]), ("heldout_0_1.jsonl", held)):
        got = [json.loads(l) for l in open(f"{d}/w1/{name}")] if os.path.exists(f"{d}/w1/{name}") else None
        if got != recs:
            failures.append(f"{name} with --limit 1: unpacked {got}, want {recs}")
    json.dump({"about": "test", "prompts": prompts[:1]}, open(f"{d}/short.json", "w"))
    r = run("unpack", "--replies", f"{d}/replies.jsonl.gz", "--prompts", f"{d}/short.json", "--work", f"{d}/w2")
    if r.returncode == 0 or "not the prompt set" not in r.stderr:
        failures.append(f"unpack with another prompt set: exit {r.returncode}, {r.stderr!r}")
if failures:
    sys.exit("\n".join(failures))
print("sharegpt replies: pack and unpack round-trip")
