"""Build a small real byte-level BPE tokenizer with a Qwen3-style chat template.

No model hub is reachable at run time, so tests, benchmarks and the default local
config train their own tokenizer (a few seconds, cached on disk). It is a real
``tokenizers`` BPE loaded through ``transformers.AutoTokenizer`` like any HF model's,
with a ChatML template that has tools, Hermes ``<tool_call>`` blocks,
``<tool_response>`` blocks and ``<think>`` reasoning that is dropped for assistant
turns before the last user query (as Qwen3 does: the naive re-render prefix breaks).
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Added (not "special") tokens: they survive skip_special_tokens, as in Qwen3.
MARKUP_TOKENS = [
    "<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
    "<function=", "</function>", "<parameter=", "</parameter>",
]

CHAT_TEMPLATE = r"""{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- endif %}
{{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
{%- for tool in tools %}{{- "\n" }}{{- tool | tojson }}{%- endfor %}
{{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
{%- set index = (messages|length - 1) - loop.index0 %}
{%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
{%- set ns.multi_step_tool = false %}{%- set ns.last_query_index = index %}
{%- endif %}
{%- endfor %}
{%- for message in messages %}
{%- if message.content is string %}{%- set content = message.content %}{%- else %}{%- set content = '' %}{%- endif %}
{%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
{{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
{%- elif message.role == "assistant" %}
{%- set reasoning_content = '' %}
{%- if message.reasoning_content is string %}{%- set reasoning_content = message.reasoning_content %}
{%- elif '</think>' in content %}
{%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
{%- set content = content.split('</think>')[-1].lstrip('\n') %}
{%- endif %}
{%- if loop.index0 > ns.last_query_index and reasoning_content %}
{{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
{%- else %}
{{- '<|im_start|>' + message.role + '\n' + content }}
{%- endif %}
{%- if message.tool_calls %}
{%- for tool_call in message.tool_calls %}
{%- if (loop.first and content) or (not loop.first) %}{{- '\n' }}{%- endif %}
{%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}
{{- '<tool_call>\n{"name": "' }}{{- tool_call.name }}{{- '", "arguments": ' }}
{%- if tool_call.arguments is string %}{{- tool_call.arguments }}{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}
{{- '}\n</tool_call>' }}
{%- endfor %}
{%- endif %}
{{- '<|im_end|>\n' }}
{%- elif message.role == "tool" %}
{%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\n<tool_response>\n' }}{{- content }}{{- '\n</tool_response>' }}
{%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}{{- '<|im_end|>\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{%- endif %}
{%- endif %}"""

_WORDS = (
    "the a an of to in is that for it as with was on be by this are from or have not but "
    "file repo test tests fix bug error function class def return import self value list "
    "dict string path run command output result check pass fail patch diff git commit "
    "python pytest assert true false none null print open read write line lines edit "
    "user assistant system tool tools call arguments name description type object "
    "properties required parameters bash shell exec apply_patch summary done let me look "
    "first now then need should will can the file at and see make sure works"
).split()


def _corpus(seed: int = 0, n_lines: int = 20000) -> list[str]:
    rng = random.Random(seed)
    lines: list[str] = []
    for i in range(n_lines):
        k = i % 5
        words = [rng.choice(_WORDS) for _ in range(rng.randint(6, 16))]
        if k == 0:
            lines.append(" ".join(words).capitalize() + ".")
        elif k == 1:
            lines.append(f"def {words[0]}_{words[1]}(self, {words[2]}):\n    return {words[3]}({words[4]!r})")
        elif k == 2:
            lines.append(json.dumps({"name": words[0], "arguments": {words[1]: " ".join(words[2:])}}))
        elif k == 3:
            lines.append(f"<tool_call>\n{json.dumps({'name': 'Bash', 'arguments': {'command': ' '.join(words)}})}\n</tool_call>")
        else:
            lines.append(f"$ git diff --stat {words[0]}.py | {i} {rng.random():.4f} {words[1].upper()} {{}}[]()")
    return lines


def build_tokenizer(out_dir: str | os.PathLike[str], *, vocab_size: int = 4096, seed: int = 0) -> Path:
    """Train (or reuse) the test tokenizer in ``out_dir``; returns the directory.

    The result loads with ``AutoTokenizer.from_pretrained(out_dir)``.
    """
    # heavy: tokenizers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    out = Path(out_dir)
    if (out / "tokenizer.json").exists() and (out / "tokenizer_config.json").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    tok.add_tokens(MARKUP_TOKENS)
    tmp = out / "tokenizer.json.tmp"
    tok.save(str(tmp))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1 << 20,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    os.replace(tmp, out / "tokenizer.json")
    return out
