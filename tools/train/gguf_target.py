"""A target GGUF as a frozen fp32 torch model with Llama.forward's interface and config `c`, by
its architecture: llama as model.Llama, gemma3 as gemma3.Gemma3. Above both modules, so that
neither imports the other's loader. target_config: the config alone, from the metadata."""
from gemma3 import load_gguf_gemma3
from model import gguf_llama_config, load_gguf_llama


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


def target_config(path):
    """The config of a target GGUF (what target_features.py stores beside the features) without
    dequantizing its weights: llama and qwen2 from the metadata (qwen2 has no torch port: its
    features come from `specula target-features`), gemma3 through its loader."""
    import gguf
    r = gguf.GGUFReader(path)
    arch = r.fields["general.architecture"].contents()
    if arch == "gemma3":
        return load_gguf_target(path).c
    if arch not in ("llama", "qwen2"):
        raise ValueError(f"{path}: architecture {arch}, expected llama, qwen2 or gemma3")
    kv = {k: f.contents() for k, f in r.fields.items() if not k.startswith("tokenizer.")}
    return gguf_llama_config(kv, {t.name: t for t in r.tensors}, arch)
