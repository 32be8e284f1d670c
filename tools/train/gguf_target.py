"""A target GGUF as a frozen fp32 torch model with Llama.forward's interface and config `c`, by
its architecture: llama as model.Llama, gemma3 as gemma3.Gemma3. Above both modules, so that
neither imports the other's loader."""
from gemma3 import load_gguf_gemma3
from model import load_gguf_llama


def load_gguf_target(path):
    import gguf
    r = gguf.GGUFReader(path)
    kv = {k: f.contents() for k, f in r.fields.items() if not k.startswith("tokenizer.")}
    arch = kv["general.architecture"]
    tensors = {t.name: t for t in r.tensors}
    if arch == "gemma3":
        return load_gguf_gemma3(r, kv, tensors)
    if arch != "llama":
        raise ValueError(f"{path}: architecture {arch}, expected llama or gemma3")
    return load_gguf_llama(kv, tensors)
