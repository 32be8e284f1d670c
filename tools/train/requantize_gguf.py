#!/usr/bin/env python3
"""Requantize an EAGLE head GGUF's Q8_0 matrices to Q4_0, keeping every key, every other tensor
and `output.weight` (the head's lm_head: its ranking is the draft) as they are.
  requantize_gguf.py --input models/smollm2-eagle3.gguf --output head-q4.gguf
A drafter level streams the head's weights once, so its time is their bytes over the memory
bandwidth: Q4_0 layers make each level cheaper (models/README.md has the measured effect)."""
import argparse

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q

ap = argparse.ArgumentParser()
ap.add_argument("--input", required=True)
ap.add_argument("--output", required=True)
a = ap.parse_args()

r = gguf.GGUFReader(a.input)
w = gguf.GGUFWriter(a.output, r.fields["general.architecture"].contents())
for f in r.fields.values():
    if f.name.startswith("GGUF.") or f.name == "general.architecture":
        continue  # the writer adds these itself
    value = f.contents()
    if f.name == "general.file_type":
        value = int(gguf.LlamaFileType.MOSTLY_Q4_0)
    w.add_key_value(f.name, value, f.types[0], sub_type=f.types[-1] if len(f.types) > 1 else None)
for t in r.tensors:
    if t.tensor_type == Q.Q8_0 and t.name != "output.weight":
        shape = [int(x) for x in reversed(t.shape.tolist())]
        weights = gguf.quants.dequantize(t.data, Q.Q8_0).reshape(shape).astype(np.float32)
        w.add_tensor(t.name, gguf.quants.quantize(weights, Q.Q4_0), raw_dtype=Q.Q4_0)
        print(f"{t.name:28s} {tuple(shape)} q8_0 -> q4_0")
    else:
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
