"""The --feats arguments of train_eagle.py: FILE or FILE:N, N the file's weight (its training
sequences count N times in an epoch and in the draft vocabulary's token counts). A file named more
than once adds up its weights and is read once: repeating a file by listing it again cost its
memory again, gigabytes for a few files of ShareGPT features."""
import re


def weighted_feats(specs):
    """[(path, weight)] in first-named order, from the --feats arguments."""
    weights = {}
    for spec in specs:
        m = re.fullmatch(r"(.+):([0-9]+)", spec)
        path, weight = (m.group(1), int(m.group(2))) if m else (spec, 1)
        if weight < 1:
            raise ValueError(f"--feats {spec}: the weight after ':' is a whole number of at least 1")
        weights[path] = weights.get(path, 0) + weight
    return list(weights.items())
