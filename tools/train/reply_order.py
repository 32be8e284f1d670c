"""The order in which generate_responses.py replies to a prompt set: the held-out prompts first, then
the categories round-robin, so that a run cut short (--limit) still covers every category.
sharegpt_replies.py unpack --limit cuts the committed replies by the same order, so that a LIMIT
names the same replies however many more the committed file holds."""


def reply_order(prompts, split=None, single_turn=False):
    """Indices into `prompts` in reply order; only `split`'s (train / heldout) when given, and with
    single_turn only the prompts without an earlier conversation."""
    by_cat = {}
    for i, p in enumerate(prompts):
        if single_turn and p.get("context"):
            continue
        by_cat.setdefault(p["category"], []).append(i)
    rounds = [i for k in range(max(map(len, by_cat.values()), default=0)) for ids in by_cat.values() if k < len(ids) for i in [ids[k]]]
    order = [i for i in rounds if prompts[i]["split"] == "heldout"] + [i for i in rounds if prompts[i]["split"] != "heldout"]
    return [i for i in order if not split or prompts[i]["split"] == split]
