"""Tool-call formats, reasoning split, echo tolerance, the incremental renderer's template checks."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from farm.gateway.canonical import assistant_message, echo_matches, merge_consecutive
from farm.gateway.render import PromptRenderer, _probe_conversation
from farm.modeltext.toolcalls import ToolCall, get_format, split_reasoning

CALLS = [ToolCall("a", "Bash", {"command": "ls -la", "n": 3}), ToolCall("b", "Read", {"path": "x.py", "opts": [1, 2]})]


def test_hermes_matches_the_chat_template(hf_tokenizer):
    """Rendered calls are byte-identical to what the template writes for tool_calls."""
    msg = {"role": "assistant", "content": "Looking.",
           "tool_calls": [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                          for c in CALLS]}  # fmt: skip
    text = hf_tokenizer.apply_chat_template([{"role": "user", "content": "u"}, msg], tokenize=False)
    assert "Looking.\n" + get_format("hermes").render(CALLS) + "<|im_end|>" in text


def test_formats_round_trip_and_reasoning():
    for name in ("hermes", "qwen3_coder"):
        fmt = get_format(name)
        out = fmt.parse("<think>\nplan it\n</think>\n\nSure.\n" + fmt.render(CALLS))
        assert out.reasoning == "plan it" and out.content == "Sure." and not out.errors
        assert [(c.name, c.arguments) for c in out.tool_calls] == [(c.name, c.arguments) for c in CALLS]
        assert len({c.id for c in out.tool_calls}) == 2
        # the template opened <think>: the output starts inside reasoning
        out = fmt.parse("still thinking\n</think>\n\nHi", in_reasoning=True)
        assert (out.reasoning, out.content) == ("still thinking", "Hi")
        out = fmt.parse("cut off while thinking", in_reasoning=True)
        assert (out.reasoning, out.content) == ("cut off while thinking", "")
    assert split_reasoning("no reasoning here") == (None, "no reasoning here")


def test_malformed_calls_become_text_with_errors():
    fmt = get_format("hermes")
    for bad in ('<tool_call>\n{"name": "x", "arguments": {\n</tool_call>', '<tool_call>\n["x"]\n</tool_call>',
                '<tool_call>\n{"arguments": {}}\n</tool_call>', 'ok <tool_call>\n{"name": "x"'):
        out = fmt.parse(bad)
        assert out.tool_calls == () and len(out.errors) == 1 and "<tool_call>" in out.content
    mixed = fmt.parse(fmt.render(CALLS[:1]) + "\n<tool_call>\nnot json\n</tool_call>")
    assert len(mixed.tool_calls) == 1 and len(mixed.errors) == 1 and "not json" in mixed.content
    out = get_format("qwen3_coder").parse("<tool_call>\n<function=f>\nstray text\n</function>\n</tool_call>")
    assert out.tool_calls == () and out.errors


def test_qwen3_coder_types_follow_the_schema():
    fmt = get_format("qwen3_coder")
    text = fmt.render([ToolCall("a", "f", {"s": "123", "n": 123, "obj": {"k": [1]}})])
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"properties": {
        "s": {"type": "string"}, "n": {"type": "integer"}, "obj": {"type": "object"}}}}}]  # fmt: skip
    assert fmt.parse(text, tools=tools).tool_calls[0].arguments == {"s": "123", "n": 123, "obj": {"k": [1]}}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True),
                          st.dictionaries(st.from_regex(r"[a-z_]{1,8}", fullmatch=True),
                                          st.one_of(st.text(max_size=30), st.integers(), st.booleans(),
                                                    st.lists(st.integers(), max_size=3)), max_size=4)),
                min_size=1, max_size=4),
       st.text(max_size=40).filter(lambda t: "<" not in t))
def test_hermes_round_trip_property(calls, content):
    fmt = get_format("hermes")
    tcs = [ToolCall(str(i), n, a) for i, (n, a) in enumerate(calls)]
    out = fmt.parse((content + "\n" if content.strip() else "") + fmt.render(tcs))
    assert [(c.name, c.arguments) for c in out.tool_calls] == [(c.name, c.arguments) for c in tcs]
    assert out.content == content.strip("\n") if content.strip() else out.content == ""


def test_echo_tolerance():
    ours = assistant_message("I will look.", "secret plan", [ToolCall("toolu_1", "Bash", {"command": "ls", "n": 1})])
    same = {"role": "assistant", "content": "I  will\nlook. ",
            "tool_calls": [{"id": "other-id", "function": {"arguments": json.dumps({"n": 1, "command": "ls"}),
                                                           "name": "Bash"}}]}  # fmt: skip
    assert echo_matches(ours, same)  # whitespace, key order, string arguments, new id, reasoning stripped
    assert echo_matches(ours, dict(same, content=""))  # text dropped next to tool calls
    assert echo_matches(ours, dict(same, reasoning_content="secret plan"))
    assert not echo_matches(ours, dict(same, reasoning_content="another plan"))
    assert not echo_matches(ours, dict(same, content="I will look elsewhere."))
    changed = json.loads(json.dumps(same))
    changed["tool_calls"][0]["function"]["arguments"] = '{"command": "ls -la", "n": 1}'
    assert not echo_matches(ours, changed)
    assert not echo_matches(ours, {"role": "user", "content": "I will look."})
    split = merge_consecutive([{"role": "assistant", "content": "I will"},
                               {"role": "assistant", "content": "look.", "tool_calls": same["tool_calls"]}])
    assert len(split) == 1 and echo_matches(ours, split[0])


def test_incremental_render_equals_full_render(hf_tokenizer):
    msgs, tools = _probe_conversation()
    for kwargs in ({}, {"enable_thinking": False}):
        r = PromptRenderer(hf_tokenizer, template_kwargs=kwargs)
        assert r.incremental and r.tail == "<|im_end|>\n"
        # prompt before the first reply + the reply as generated + delta == full render
        prompt = r.full_prompt(msgs[:2], tools)
        rendered = r.render_text(msgs[:3], generation=False)[len(r.render_text(msgs[:2], generation=True)):]
        assert rendered.endswith("<|im_end|>\n")
        reply_ids = r.encode(rendered[:-1])  # what the model generates: up to and including its EOS
        assert reply_ids[-1] == hf_tokenizer.convert_tokens_to_ids("<|im_end|>")
        delta = r.delta_ids(msgs[2], msgs[3:5], generated_end="<|im_end|>")
        if not kwargs:
            assert prompt + reply_ids + delta == r.full_prompt(msgs[:5], tools)
        else:  # the template writes an empty think block only in the generation prompt
            assert r.decode(delta).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert PromptRenderer(hf_tokenizer).starts_in_reasoning is False


def test_template_that_needs_history_is_rendered_in_full(tokenizer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    # numbers every message: the delta depends on the whole history, no incremental render
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ loop.index }} {{ m.role }}\n{{ m.content }}"
                         "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    r = PromptRenderer(tok)
    assert r.tail == "<|im_end|>\n" and not r.incremental
    assert r.delta_ids({"role": "assistant", "content": "x"}, [{"role": "user", "content": "y"}]) is None


def test_a_reply_the_template_rewrites_later_is_not_rendered_incrementally(hf_tokenizer):
    """The Qwen3-style template drops a think block written in an earlier reply's content
    once a later user turn follows: the render of the history no longer starts with the
    render the delta would extend, so there is no incremental delta (a full render)."""
    r = PromptRenderer(hf_tokenizer)
    assert r.incremental
    plain = {"role": "assistant", "content": "x"}
    assert r.delta_text(plain, [{"role": "user", "content": "y"}]) is not None
    thinking = {"role": "assistant", "content": "<think>\nt\n</think>\n\nx"}
    assert r.delta_text(thinking, [{"role": "user", "content": "y"}]) is None
