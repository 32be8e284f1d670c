"""generate_responses.py picks its prompts before it starts a server: with --frame (completions of a
pretrained target) a prompt that carries an earlier conversation is refused by name, and
--single-turn leaves such prompts out (here every other prompt is already answered, so the run
ends without starting the server, whose path does not exist); a prompt the server refused in an
earlier run (OUT.refused.jsonl) is skipped at the same --ctx and --n and asked again at others.
Usage: test_train_generate_responses.py [tools/train dir]."""
import json
import pathlib
import subprocess
import sys
import tempfile

tool = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent.parent / "tools" / "train") / "generate_responses.py"
failures = []
with tempfile.TemporaryDirectory() as d:
    prompts = [{"category": "qa", "conversation": "a1", "turn": 0, "prompt": "What is a tide?", "split": "train"},
               {"category": "multi_turn", "conversation": "a1", "turn": 1, "prompt": "And why?", "split": "train",
                "context": [{"role": "user", "content": "What is a tide?"}, {"role": "assistant", "content": "Water."}]}]
    json.dump({"about": "test", "prompts": prompts}, open(f"{d}/prompts.json", "w"))
    with open(f"{d}/out.jsonl", "w") as f:
        f.write(json.dumps(dict(prompts[0], index=0, temp=0.0, frame="Q: {}\nA:", response="The sea rises.")) + "\n")
    run = lambda *extra: subprocess.run([sys.executable, str(tool), "--specula", f"{d}/no-such-specula", "--model", f"{d}/none.gguf",
                                         "--prompts", f"{d}/prompts.json", "--out", f"{d}/out.jsonl", "--frame", "Q: {}\nA:", *extra],
                                        capture_output=True, text=True)
    r = run()
    if r.returncode == 0 or "prompt 1 carries an earlier conversation" not in r.stderr:
        failures.append(f"a framed prompt with a conversation was not refused: rc {r.returncode}, {r.stderr.strip()[-300:]}")
    r = run("--single-turn")
    if r.returncode != 0:
        failures.append(f"--single-turn did not leave the conversation out: rc {r.returncode}, {r.stderr.strip()[-300:]}")
    # a third prompt, refused by the server in an earlier run at --ctx 1024 and --n 128 (the defaults)
    prompts.append({"category": "code", "conversation": "b1", "turn": 0, "prompt": "x" * 9000, "split": "train"})
    json.dump({"about": "test", "prompts": prompts}, open(f"{d}/prompts.json", "w"))
    with open(f"{d}/out.jsonl.refused.jsonl", "w") as f:
        f.write(json.dumps({"index": 2, "ctx": 1024, "n": 128, "error": "too long"}) + "\n")
    r = run("--single-turn")
    if r.returncode != 0 or "1 prompts the server refused at --ctx 1024 --n 128 are skipped" not in r.stderr:
        failures.append(f"a prompt refused before was asked again: rc {r.returncode}, {r.stderr.strip()[-300:]}")
    r = run("--single-turn", "--ctx", "4096")
    if r.returncode == 0:
        failures.append("a prompt refused at --ctx 1024 was not asked again at --ctx 4096 (the run ended without a server)")
for f in failures:
    print("FAIL:", f)
sys.exit(1 if failures else 0)
