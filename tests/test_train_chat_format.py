"""The training tools feed a chat target the text `specula serve` renders for the same messages:
the default system turn a Jinja template writes when the messages bring none (SmolLM2's) comes
first, Qwen2.5's (the else branch of its system check) too, and a template without one (Gemma 3's)
adds nothing. Usage: test_train_chat_format.py [tools/train dir]."""
import pathlib
import sys

sys.path.insert(0, str(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent.parent / "tools" / "train"))
from chat_format import CHAT_FORMATS, ChatFormat, default_system_turn  # noqa: E402

# SmolLM2-135M-Instruct's tokenizer.chat_template, as its GGUF stores it
SMOLLM2 = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
           "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + "
           "message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
           "{{ '<|im_start|>assistant\n' }}{% endif %}")
# Gemma 3's opening: no system turn of its own (a system message is folded into the first user turn)
GEMMA3 = ("{{ bos_token }}{%- if messages[0]['role'] == 'system' -%}{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
          "{%- set loop_messages = messages[1:] -%}{%- else -%}{%- set first_user_prefix = \"\" -%}{%- endif -%}")

# Qwen2.5-Coder-Instruct's opening as its GGUF stores it (a \n in a literal is a newline), the
# tools branch's text shortened: the default system turn is the else branch of the system check,
# after the tools branch's bare text
QWEN25 = ("{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- if messages[0]['role'] == 'system' %}\n"
          "        {{- messages[0]['content'] }}\n    {%- else %}\n"
          "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n    {%- endif %}\n"
          "{%- else %}\n    {%- if messages[0]['role'] == 'system' %}\n"
          "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n    {%- else %}\n"
          "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}\n"
          "    {%- endif %}\n{%- endif %}\n")

failures = []


def check(name, got, want):
    if got != want:
        failures.append(f"{name}: got {got!r}, want {want!r}")


chatml = CHAT_FORMATS["llama"][0]
check("SmolLM2's default system turn", default_system_turn(SMOLLM2, chatml),
      "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n")
check("a template without a default system turn", default_system_turn(GEMMA3, CHAT_FORMATS["gemma3"][0]), "")
check("Qwen2.5's default system turn", default_system_turn(QWEN25, CHAT_FORMATS["qwen2"][0]),
      "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n")
check("a chatml template that does not write one", default_system_turn(SMOLLM2.replace("!= 'system'", "== 'tool'"), chatml), "")

chat = ChatFormat.__new__(ChatFormat)  # the format's fields without reading a GGUF
chat.frame = None
chat.turn, chat.reply, chat.model_role, _ = CHAT_FORMATS["llama"]
chat.system = default_system_turn(SMOLLM2, chatml)
check("a later turn after its context", chat.text("and b?", [{"role": "user", "content": "a?"}, {"role": "assistant", "content": "A."}]),
      "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
      "<|im_start|>user\na?<|im_end|>\n<|im_start|>assistant\nA.<|im_end|>\n<|im_start|>user\nand b?<|im_end|>\n<|im_start|>assistant\n")

if failures:
    sys.exit("\n".join(failures))
print("chat format: 5 checks passed")
