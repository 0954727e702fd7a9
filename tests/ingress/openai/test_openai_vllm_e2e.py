"""The OpenAI ingress in front of the real engine: the ``vllm`` backend serving the tiny
Llama of tests/support/tiny_llama.py (Triton's vLLM repository layout), driven by the
official ``openai`` client. Greedy outputs, streamed or not, chat or completions, base
model or adapter, are token for token those of vLLM's own ``LLM.generate`` on the same
prompt (chat: the model's template applied); a client that goes away aborts its request
in the engine. Prompts may be token ids, and several (a list): each its own choices, numbered across
prompts; ``echo`` with ``logprobs`` shows the prompt's tokens' logprobs, vLLM's ``prompt_logprobs``.
Adapters come from ``multi_lora.json``, from the version's ``loras/`` folder, and
at run time (``/v1/load_lora_adapter``, plain HTTP), until unloaded. The same tiny Llama also serves as
a pooling model (``"runner": "pooling"``) beside it: ``/v1/embeddings`` answers vLLM's own
``LLM.embed`` vectors, and each model refuses the other's route."""

from __future__ import annotations

import base64
import http.client
import json
import time
import urllib.request
from typing import Any

import jsonschema  # in the test extra (openapi-spec-validator's), as is the openai client
import numpy as np
import openai
import pytest

from conveyor.ingress.openai.embeddings import MAX_INPUTS
from tests.support import tiny_llama
from tests.support.group import Server
from tests.support.vllm_group import EMBED_MODEL, FOLDER_ADAPTER, MODEL, SEP, VllmGroup
from tests.support.vllm_reference import (
    CHAT,
    EMBED_INPUTS,
    MAX_TOKENS,
    OTHER,
    PROMPT,
    SAMPLED_TOKENS,
    SEED,
    TEMPERATURE,
    TOP,
    N,
)

LEVEL = "e2e"

tiny_llama.require_vllm()

# The group's fixture runs vLLM's reference and loads the group's engine (~100 s here alone, more on a
# loaded host): it counts against the first test's time.
pytestmark = pytest.mark.timeout(600)

RUNTIME_ADAPTER = "delta"  # loaded at run time: beta's weights under another name
EOS = "</s>"  # the tiny Llama's end-of-sequence token


@pytest.fixture(scope="module")
def group(served_llm: VllmGroup) -> VllmGroup:
    """The session's vLLM group (tests/support/vllm_group.py), which test_vllm_e2e.py's tests share."""
    return served_llm


@pytest.fixture(scope="module")
def client(group: VllmGroup) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{group.openai_port}/v1", api_key="none", max_retries=0, timeout=60)


def _name(adapter: str | None) -> str:
    return MODEL if adapter is None else f"{MODEL}{SEP}{adapter}"


def test_models_lists_the_models_and_the_adapters(client: openai.OpenAI) -> None:
    cards = [m.to_dict() for m in client.models.list()]
    assert [c["id"] for c in cards] == [EMBED_MODEL, MODEL,
                                        *(_name(a) for a in (*tiny_llama.ADAPTERS, FOLDER_ADAPTER))]
    assert [c["parent"] for c in cards] == [None, None, MODEL, MODEL, MODEL]


def test_an_adapter_in_the_loras_folder_is_served(group: VllmGroup, client: openai.OpenAI) -> None:
    out = client.completions.create(model=_name(FOLDER_ADAPTER), prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0)
    assert out.choices[0].text == group.ref.completion["alpha"][0]


@pytest.mark.parametrize("adapter", [None, *tiny_llama.ADAPTERS])
def test_completions_are_vllms_greedy_outputs(group: VllmGroup, client: openai.OpenAI, adapter: str | None) -> None:
    text, n_out, n_in = group.ref.completion[adapter]
    out = client.completions.create(model=_name(adapter), prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0)
    assert out.choices[0].text == text
    assert out.usage is not None and (out.usage.prompt_tokens, out.usage.completion_tokens) == (n_in, n_out)
    chunks = list(client.completions.create(model=_name(adapter), prompt=PROMPT, max_tokens=MAX_TOKENS,
                                            temperature=0, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == n_out


def test_an_image_to_a_text_only_model_is_a_400_and_the_next_chat_is_served(group: VllmGroup,
                                                                            client: openai.OpenAI) -> None:
    png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"  # 1x1
    url = f"data:image/png;base64,{png}"
    image: Any = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                               {"type": "text", "text": "hello world"}]}]
    with pytest.raises(openai.BadRequestError, match=f"model '{MODEL}' does not take images"):
        client.chat.completions.create(model=MODEL, messages=image, max_tokens=MAX_TOKENS, temperature=0)
    out = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=MAX_TOKENS,  # type: ignore[arg-type]
                                         temperature=0)
    assert out.choices[0].message.content == group.ref.chat[None][0]


@pytest.mark.parametrize("adapter", [None, *tiny_llama.ADAPTERS])
def test_chat_is_vllms_greedy_output_on_the_template(group: VllmGroup, client: openai.OpenAI,
                                                    adapter: str | None) -> None:
    text, n_out, n_in = group.ref.chat[adapter]
    out = client.chat.completions.create(model=_name(adapter), messages=CHAT, max_tokens=MAX_TOKENS,  # type: ignore[arg-type]
                                         temperature=0)
    assert out.choices[0].message.content == text
    assert out.usage is not None and (out.usage.prompt_tokens, out.usage.completion_tokens) == (n_in, n_out)
    chunks = list(client.chat.completions.create(model=_name(adapter), messages=CHAT,  # type: ignore[arg-type]
                                                 max_tokens=MAX_TOKENS, temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"  # type: ignore[attr-defined]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text  # type: ignore[attr-defined]


def test_adapters_change_the_output(group: VllmGroup) -> None:
    """Otherwise the tests above would not show the adapter reached the engine."""
    texts = {a: group.ref.completion[a][0] + group.ref.chat[a][0] for a in (None, *tiny_llama.ADAPTERS)}
    assert len(set(texts.values())) == len(texts), texts


def test_n_choices_are_vllms_seeded_samples(group: VllmGroup, client: openai.OpenAI) -> None:
    """``n`` sequences of one request, in index order, streamed or not: those of vLLM's own run with
    the same seed (each sequence samples with seed + index)."""
    assert len(set(group.ref.sampled)) > 1  # otherwise a mix-up of choices would go unseen
    out = client.completions.create(model=MODEL, prompt=PROMPT, n=N, seed=SEED, temperature=TEMPERATURE,
                                    max_tokens=SAMPLED_TOKENS)
    assert [c.index for c in out.choices] == list(range(N))
    assert [c.text for c in out.choices] == group.ref.sampled
    assert all(c.finish_reason in ("stop", "length") for c in out.choices), out.choices
    assert out.usage is not None and 0 < out.usage.completion_tokens <= N * SAMPLED_TOKENS
    texts = [""] * N
    reasons: list[list[str]] = [[] for _ in range(N)]
    for chunk in client.completions.create(model=MODEL, prompt=PROMPT, n=N, seed=SEED, temperature=TEMPERATURE,
                                           max_tokens=SAMPLED_TOKENS, stream=True):
        for c in chunk.choices:
            texts[c.index] += c.text
            if c.finish_reason is not None:
                reasons[c.index].append(c.finish_reason)
    assert texts == group.ref.sampled
    assert all(len(r) == 1 for r in reasons), reasons  # each choice finishes once


def test_structured_outputs_constrain_the_answer(client: openai.OpenAI) -> None:
    # vLLM's own field, and OpenAI's response_format: the engine's guided decoding either way.
    out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0,
                                    extra_body={"structured_outputs": {"choice": ["yes", "no"]}})
    assert out.choices[0].text in ("yes", "no")
    messages: Any = CHAT
    enum: Any = {"type": "json_schema", "json_schema": {"name": "pick", "schema": {"enum": ["x", "y"]}, "strict": True}}
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0,
                                          response_format=enum)
    assert json.loads(chat.choices[0].message.content or "") in ("x", "y")
    chunks = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0,
                                            stream=True, response_format={"type": "json_object"})
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text.startswith("{"), text  # an object begins (the tiny model rarely ends one in 8 tokens)


def test_a_schema_the_engine_cannot_compile_is_a_400_with_the_reason(client: openai.OpenAI) -> None:
    messages: Any = CHAT
    bad: Any = {"type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "nonsense"}}}
    with pytest.raises(openai.BadRequestError, match="nonsense"):
        client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, response_format=bad)
    with pytest.raises(openai.BadRequestError, match="cannot both be set"):
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, extra_body={
            "response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}})


def test_logprobs_describe_each_generated_token(group: VllmGroup, client: openai.OpenAI) -> None:
    # Greedy: each token is its place's most likely one, so it leads its own alternatives.
    text, n_out, _ = group.ref.chat[None]
    messages: Any = CHAT
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=MAX_TOKENS, temperature=0,
                                          logprobs=True, top_logprobs=2)
    lp = chat.choices[0].logprobs
    assert lp is not None and lp.content is not None and len(lp.content) == n_out
    # The end-of-sequence token is among them (its logprob counts), though not in the text (as vLLM's server).
    assert "".join(t.token for t in lp.content).removesuffix(EOS) == text == chat.choices[0].message.content
    for t in lp.content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 2 and t.top_logprobs[0].token == t.token
        assert t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob and t.bytes == list(t.token.encode())
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=MAX_TOKENS,
                                                 temperature=0, logprobs=True, stream=True))
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs and c.choices[0].logprobs.content
                for t in c.choices[0].logprobs.content]
    assert "".join(t.token for t in streamed).removesuffix(EOS) == text
    assert all(t.top_logprobs == [] for t in streamed)
    completion_text = group.ref.completion[None][0]
    out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0, logprobs=1)
    done = out.choices[0].logprobs
    assert done is not None and done.tokens is not None and "".join(done.tokens).removesuffix(EOS) == completion_text
    assert done.text_offset == [sum(len(t) for t in done.tokens[:i]) for i in range(len(done.tokens))]
    assert done.top_logprobs is not None and all(len(top) == 1 for top in done.top_logprobs)
    with pytest.raises(openai.BadRequestError, match="top_logprobs"):
        client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2, top_logprobs=2)


PAST_EOS = 40  # max_tokens with ignore_eos: the greedy answer (12 tokens at most) then many textless tokens


def test_streamed_logprobs_are_every_tokens_past_the_end_of_sequence(group: VllmGroup, client: openai.OpenAI) -> None:
    """With ``ignore_eos`` the tokens after ``</s>`` have no text; streamed, each still has its logprob (vLLM's
    server sends a chunk for every token when logprobs are asked for): the chunks' logprobs, joined, are the
    answer's that does not stream, text offsets included."""
    body: Any = {"ignore_eos": True}
    out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=PAST_EOS, temperature=0, logprobs=TOP,
                                    extra_body=body)
    done = out.choices[0].logprobs
    assert done is not None and done.tokens is not None and len(done.tokens) == PAST_EOS
    assert EOS in done.tokens[:-1]  # the tokens after it are textless
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=PAST_EOS, temperature=0,
                                            logprobs=TOP, stream=True, extra_body=body))
    streamed = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].logprobs is not None]
    assert [t for s in streamed for t in s.tokens or []] == done.tokens
    assert [o for s in streamed for o in s.text_offset or []] == done.text_offset
    assert [v for s in streamed for v in s.token_logprobs or []] == pytest.approx(done.token_logprobs, abs=1e-4)
    assert [list(top) for s in streamed for top in s.top_logprobs or []] == [list(t) for t in done.top_logprobs or []]

    messages: Any = CHAT
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=PAST_EOS, temperature=0,
                                          logprobs=True, top_logprobs=2, extra_body=body)
    whole = chat.choices[0].logprobs
    assert whole is not None and whole.content is not None and len(whole.content) == PAST_EOS
    assert EOS in [t.token for t in whole.content[:-1]]
    parts = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=PAST_EOS, temperature=0,
                                                logprobs=True, top_logprobs=2, stream=True, extra_body=body))
    entries = [t for c in parts if c.choices and c.choices[0].logprobs and c.choices[0].logprobs.content
               for t in c.choices[0].logprobs.content]
    assert [(t.token, [a.token for a in t.top_logprobs]) for t in entries] == \
        [(t.token, [a.token for a in t.top_logprobs]) for t in whole.content]
    assert [t.logprob for t in entries] == pytest.approx([t.logprob for t in whole.content], abs=1e-4)


def test_logit_bias_steers_the_engine_and_bad_ids_are_400s(group: VllmGroup, client: openai.OpenAI) -> None:
    """A +100 bias on one token makes greedy decoding write only it; ids as vLLM's server takes them."""
    token = json.loads(_post(group, "/tokenize", {"model": MODEL, "prompt": "hello world",
                                                  "add_special_tokens": False})[1])["tokens"][-1]
    expected = json.loads(_post(group, "/detokenize", {"model": MODEL, "tokens": [token] * 3})[1])["prompt"]
    out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0,
                                    logit_bias={str(token): 100})
    assert out.choices[0].text == expected
    with pytest.raises(openai.BadRequestError, match="out-of-vocab"):
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, logit_bias={"1000000": 5})
    with pytest.raises(openai.BadRequestError, match="integer token IDs"):
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, logit_bias={"abc": 5})


WEATHER: Any = {"type": "function", "function": {
    "name": "get_weather", "description": "the weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["oslo", "rome"]},
                                                    "metric": {"type": "boolean"}},
                   "required": ["city", "metric"], "additionalProperties": False}}}
CLOCK: Any = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string", "enum": ["utc", "cet"]}}, "required": ["zone"],
    "additionalProperties": False}}}
FORCED: Any = {"type": "function", "function": {"name": "get_weather"}}
TOOL_TOKENS = 48  # room for the forced JSON: a dozen tokens or so


def _valid_arguments(text: str) -> dict[str, Any]:
    arguments = json.loads(text)
    jsonschema.validate(arguments, WEATHER["function"]["parameters"])
    return dict(arguments)


def test_a_named_tool_choice_is_a_call_with_valid_arguments(client: openai.OpenAI) -> None:
    """Guided decoding on the function's parameter schema: a random-weights model calls it properly."""
    messages: Any = CHAT
    out = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER, CLOCK], tool_choice=FORCED,
                                         max_tokens=TOOL_TOKENS, temperature=0)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.tool_calls is not None and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    assert call.id.startswith("call_") and call.type == "function" and call.function.name == "get_weather"
    whole = _valid_arguments(call.function.arguments)
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER, CLOCK],
                                                 tool_choice=FORCED, max_tokens=TOOL_TOKENS, temperature=0,
                                                 stream=True))
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    first = deltas[0]
    assert first.index == 0 and first.id is not None and first.id.startswith("call_") and first.type == "function"
    assert first.function is not None and first.function.name == "get_weather"
    assert all(d.index == 0 and d.function is not None and d.function.name is None for d in deltas[1:])
    streamed = "".join(d.function.arguments or "" for d in deltas if d.function is not None)
    assert _valid_arguments(streamed) == whole  # greedy: the same call
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_required_tool_choice_calls_a_tool(client: openai.OpenAI) -> None:
    messages: Any = CHAT
    out = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], tool_choice="required",
                                         parallel_tool_calls=False, max_tokens=TOOL_TOKENS + 16, temperature=0)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.tool_calls is not None and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather"
    _valid_arguments(call.function.arguments)


def test_tool_choice_none_and_the_history_of_a_call(group: VllmGroup, client: openai.OpenAI) -> None:
    """With ``none`` the answer is text (the tiny model's template writes no tools: its greedy answer); a
    history holding an assistant's call and the tool's result is accepted."""
    text = group.ref.chat[None][0]
    messages: Any = CHAT
    out = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], tool_choice="none",
                                         max_tokens=MAX_TOKENS, temperature=0)
    assert out.choices[0].message.content == text and out.choices[0].message.tool_calls is None
    history: Any = [*CHAT, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                          "arguments": '{"city": "oslo", "metric": true}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "rain"}]
    after = client.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER], tool_choice=FORCED,
                                           max_tokens=TOOL_TOKENS, temperature=0)
    calls = after.choices[0].message.tool_calls
    assert calls is not None and calls[0].type == "function" and calls[0].function.name == "get_weather"
    _valid_arguments(calls[0].function.arguments)


def test_bad_tool_requests_are_400s(client: openai.OpenAI) -> None:
    messages: Any = CHAT
    with pytest.raises(openai.BadRequestError, match="'launch', which is not in `tools`"):
        client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER],
                                       tool_choice={"type": "function", "function": {"name": "launch"}})


def test_auto_reads_the_text_with_the_models_parser(group: VllmGroup, client: openai.OpenAI) -> None:
    """``auto`` (the default with tools): the model's TOOL_CALL_PARSER reads its text; the tiny model's greedy
    answer calls nothing, so it is the content. (A model without a parser refuses ``auto``:
    test_openai_tools.py; a forced call too: test_openai_ingress.py.)"""
    messages: Any = CHAT
    out = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], max_tokens=MAX_TOKENS,
                                         temperature=0)
    assert out.choices[0].message.content == group.ref.chat[None][0] and out.choices[0].message.tool_calls is None


def test_unknown_model_and_adapter(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="a")
    with pytest.raises(openai.NotFoundError) as err:
        client.completions.create(model=_name("zeta"), prompt="a")
    assert "no LoRA adapter 'zeta'" in err.value.message


def test_token_id_prompts_and_several_prompts_are_vllms(group: VllmGroup, client: openai.OpenAI) -> None:
    """A prompt of ids is the engine's ``TokensPrompt``: PROMPT's ids answer PROMPT's greedy text, and
    ``usage.prompt_tokens`` counts them. Several prompts, ids or text, each get ``n`` choices, numbered
    across prompts; streamed, the same."""
    ref = group.ref
    ids, other_ids = ref.prompt_ids
    text = ref.completion[None][0]
    one = client.completions.create(model=MODEL, prompt=ids, max_tokens=MAX_TOKENS, temperature=0)
    assert one.choices[0].text == text
    assert one.usage is not None and one.usage.prompt_tokens == len(ids)
    expected = [text, ref.other]
    for prompts in (ref.prompt_ids, [PROMPT, OTHER]):
        out = client.completions.create(model=MODEL, prompt=prompts, max_tokens=MAX_TOKENS, temperature=0)
        assert [(c.index, c.text) for c in out.choices] == list(enumerate(expected))
        assert out.usage is not None and out.usage.prompt_tokens == len(ids) + len(other_ids)
        texts = [""] * 2
        chunks = list(client.completions.create(model=MODEL, prompt=prompts, max_tokens=MAX_TOKENS,
                                                temperature=0, stream=True, stream_options={"include_usage": True}))
        for chunk in chunks:
            for c in chunk.choices:
                texts[c.index] += c.text
        assert texts == expected
        usage = chunks[-1].usage
        assert usage is not None and (usage.prompt_tokens, usage.completion_tokens) == (
            out.usage.prompt_tokens, out.usage.completion_tokens)
    # n choices of each prompt, numbered across prompts: each prompt's seeded samples, vLLM's own
    sampled = client.completions.create(model=MODEL, prompt=[ids, ids], n=N, seed=SEED, temperature=TEMPERATURE,
                                        max_tokens=SAMPLED_TOKENS)
    assert [(c.index, c.text) for c in sampled.choices] == list(enumerate(ref.sampled * 2))
    with pytest.raises(openai.BadRequestError, match="Token id 1000000 is out of vocabulary"):  # the engine's words
        client.completions.create(model=MODEL, prompt=[ids, [1, 1000000]], max_tokens=2)


def _same_logprobs(found: Any, expected: list[list[Any]]) -> None:
    assert found.tokens == [pos[0][0] for pos in expected]
    assert len(found.token_logprobs) == len(expected) == len(found.top_logprobs)
    for value, top, pos in zip(found.token_logprobs, found.top_logprobs, expected, strict=True):
        assert value == pytest.approx(pos[0][1], abs=1e-4)
        assert list(top) == [tok for tok, _ in pos]
        assert list(top.values()) == pytest.approx([lp for _, lp in pos], abs=1e-4)


def test_echo_with_logprobs_shows_the_prompts_tokens_as_vllm(group: VllmGroup, client: openai.OpenAI) -> None:
    """The prompt's text leads the choice's, and its tokens' logprobs (vLLM's ``prompt_logprobs``) lead
    the generated tokens', the first token's null; streamed, they come in the first chunk."""
    ref = group.ref
    echo, ids = ref.echo, ref.prompt_ids[0]
    out = client.completions.create(model=MODEL, prompt=ids, echo=True, logprobs=TOP, max_tokens=MAX_TOKENS,
                                    temperature=0)
    choice = out.choices[0]
    assert choice.text == echo["text"]
    lp = choice.logprobs
    assert lp is not None and lp.tokens is not None and lp.token_logprobs is not None and lp.top_logprobs is not None
    assert (lp.tokens[0], lp.token_logprobs[0], lp.top_logprobs[0]) == (echo["first_token"], None, None)
    rest = lp.model_copy(update={k: getattr(lp, k)[1:] for k in ("tokens", "token_logprobs", "top_logprobs")})
    _same_logprobs(rest, echo["prompt"] + echo["output"])
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, echo=True, logprobs=TOP, stream=True,
                                            max_tokens=MAX_TOKENS, temperature=0))
    assert chunks[0].choices[0].text.startswith(PROMPT)  # a text prompt echoes as it was sent
    assert "".join(c.choices[0].text for c in chunks) == PROMPT + ref.completion[None][0]
    streamed = [c.choices[0].logprobs for c in chunks if c.choices[0].logprobs is not None]
    first = streamed[0]
    assert first.token_logprobs is not None and first.token_logprobs[0] is None
    assert first.tokens is not None and len(first.tokens) > len(echo["prompt"])  # the prompt's and the first token
    tokens = [t for s in streamed for t in s.tokens or []]
    assert tokens == [echo["first_token"], *(pos[0][0] for pos in echo["prompt"] + echo["output"])]
    values = [v for s in streamed for v in s.token_logprobs or []]
    assert values[1:] == pytest.approx([pos[0][1] for pos in echo["prompt"] + echo["output"]], abs=1e-4)


def _close(found: list[float], expected: list[float]) -> None:
    np.testing.assert_allclose(np.array(found, dtype=np.float32), np.array(expected, dtype=np.float32), rtol=1e-5,
                               atol=1e-7)


def test_embeddings_are_vllms_own(group: VllmGroup, client: openai.OpenAI) -> None:
    """A list of prompts, each its own engine request, answered in order; as floats, as base64 (the
    float32 bytes, which the openai client also asks for by default and decodes), and for token ids."""
    ref = group.ref
    out = client.embeddings.create(model=EMBED_MODEL, input=EMBED_INPUTS, encoding_format="float")
    assert (out.object, out.model, [d.index for d in out.data]) == ("list", EMBED_MODEL, [0, 1, 2])
    assert all(d.object == "embedding" for d in out.data)
    for d, expected in zip(out.data, ref.embeddings, strict=False):
        _close(d.embedding, expected)
    n = sum(ref.embed_tokens[:3])
    assert (out.usage.prompt_tokens, out.usage.total_tokens) == (n, n)
    encoded = client.embeddings.create(model=EMBED_MODEL, input=EMBED_INPUTS[1], encoding_format="base64")
    raw = encoded.data[0].embedding
    assert isinstance(raw, str)
    _close(np.frombuffer(base64.b64decode(raw), dtype="<f4").tolist(), ref.embeddings[1])
    decoded = client.embeddings.create(model=EMBED_MODEL, input=EMBED_INPUTS[2])  # the client's base64
    _close(decoded.data[0].embedding, ref.embeddings[2])
    ids = client.embeddings.create(model=EMBED_MODEL, input=ref.token_ids, encoding_format="float")
    _close(ids.data[0].embedding, ref.embeddings[3])
    assert ids.usage.prompt_tokens == ref.embed_tokens[3] == len(ref.token_ids)


def test_each_model_refuses_the_others_route_in_vllms_words(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="The model does not support Embeddings API"):
        client.embeddings.create(model=MODEL, input="hello world")
    with pytest.raises(openai.BadRequestError, match="The model does not support Completions API"):
        client.completions.create(model=EMBED_MODEL, prompt=PROMPT, max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="The model does not support Chat Completions API"):
        client.chat.completions.create(model=EMBED_MODEL, messages=CHAT, stream=True)  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError, match="does not support Matryoshka"):  # the engine's words
        client.embeddings.create(model=EMBED_MODEL, input="hello world", dimensions=8)
    with pytest.raises(openai.BadRequestError, match=f"maximum allowed count of {MAX_INPUTS}"):
        client.embeddings.create(model=EMBED_MODEL, input=["a"] * (MAX_INPUTS + 1))


def test_usage_counts_the_prompt_tokens_the_prefix_cache_held(client: openai.OpenAI) -> None:
    words = " ".join(tiny_llama.LINES).replace(",", "").split()
    prompt = " ".join(words[i % len(words)] for i in range(50))  # 154 tokens: a whole 128-token CPU block
    first, second = (client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, temperature=0)
                     for _ in range(2))
    assert first.usage is not None and second.usage is not None
    held = [u.prompt_tokens_details.cached_tokens if u.prompt_tokens_details else None
            for u in (first.usage, second.usage)]
    assert held[0] is not None and held[1] is not None, held
    assert held[0] < 128 <= held[1] < second.usage.prompt_tokens, held


def _post(group: VllmGroup, path: str, body: dict[str, Any]) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", group.openai_port, timeout=120)
    try:
        conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, r.read().decode()
    finally:
        conn.close()


def _error(text: str) -> str:
    return str(json.loads(text)["error"]["message"])


def _metric_lines(srv: Server, name: str) -> list[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.metrics_port}/metrics", timeout=10) as r:
        return [line for line in r.read().decode().splitlines() if line.startswith(name + "{")]


def test_an_adapter_loaded_at_run_time_serves_until_unloaded(group: VllmGroup, client: openai.OpenAI) -> None:
    beta = str(group.adapters["beta"])
    load = {"lora_name": RUNTIME_ADAPTER, "lora_path": beta}
    assert _post(group, "/v1/load_lora_adapter", load) == (
        200, f"Success: LoRA adapter '{RUNTIME_ADAPTER}' added successfully.")
    try:  # the group is shared: the next module must not find it loaded
        cards = {m.id: m.to_dict() for m in client.models.list()}
        assert (cards[RUNTIME_ADAPTER]["parent"], cards[RUNTIME_ADAPTER]["root"]) == (MODEL, beta)
        assert client.models.retrieve(RUNTIME_ADAPTER).to_dict()["parent"] == MODEL
        # used by its name (vLLM's way) or as <model><separator><adapter>: beta's greedy output, as vLLM's own
        text = group.ref.completion["beta"][0]
        for name in (RUNTIME_ADAPTER, _name(RUNTIME_ADAPTER)):
            out = client.completions.create(model=name, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0)
            assert (out.choices[0].text, out.model) == (text, name)
        chunks = list(client.chat.completions.create(model=RUNTIME_ADAPTER, messages=CHAT,  # type: ignore[arg-type]
                                                     max_tokens=MAX_TOKENS, temperature=0, stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == group.ref.chat["beta"][0]  # type: ignore[attr-defined]

        # vLLM's refusals: a duplicate, a name that is a model's, a path with no adapter
        status, body = _post(group, "/v1/load_lora_adapter", load)
        assert status == 400 and _error(body) == (
            f"The lora adapter '{RUNTIME_ADAPTER}' has already been loaded. If you want to load the adapter in place, "
            "set 'load_inplace' to True.")
        status, body = _post(group, "/v1/load_lora_adapter", {"lora_name": MODEL, "lora_path": beta})
        assert status == 400 and _error(body) == f"The lora adapter '{MODEL}' conflicts with a served base model."
        status, body = _post(group, "/v1/load_lora_adapter", {"lora_name": "lost", "lora_path": "/no/such/adapter"})
        assert status == 404 and _error(body) == "Loading lora lost failed: No adapter found for /no/such/adapter"
        assert "lost" not in {m.id for m in client.models.list()}

        # the engine's adapter use, as vLLM's server exports it for LoRA-aware gateways
        deadline = time.monotonic() + 10
        while not (lines := _metric_lines(group.server, "vllm:lora_requests_info")) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert lines and all('max_lora="2"' in line and "running_lora_adapters=" in line
                             and "waiting_lora_adapters=" in line for line in lines), lines
        assert float(lines[-1].rsplit(" ", 1)[1]) > time.time() - 3600  # a timestamp
    except BaseException:
        _post(group, "/v1/unload_lora_adapter", {"lora_name": RUNTIME_ADAPTER})
        raise

    assert _post(group, "/v1/unload_lora_adapter", {"lora_name": RUNTIME_ADAPTER}) == (
        200, f"Success: LoRA adapter '{RUNTIME_ADAPTER}' removed successfully.")
    with pytest.raises(openai.NotFoundError) as err:
        client.completions.create(model=RUNTIME_ADAPTER, prompt=PROMPT, max_tokens=MAX_TOKENS)
    assert err.value.code == "model_not_found"
    assert RUNTIME_ADAPTER not in {m.id for m in client.models.list()}
    status, body = _post(group, "/v1/unload_lora_adapter", {"lora_name": RUNTIME_ADAPTER})
    assert status == 404 and _error(body) == f"The lora adapter '{RUNTIME_ADAPTER}' cannot be found."


def _generated_tokens(srv: Server) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.metrics_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:generation_tokens_total"))


def test_a_client_that_goes_away_aborts_its_request(group: VllmGroup) -> None:
    before = _generated_tokens(group.server)
    conn = http.client.HTTPConnection("127.0.0.1", group.openai_port, timeout=60)
    conn.request("POST", "/v1/completions", body=json.dumps(
        {"model": MODEL, "prompt": PROMPT, "max_tokens": 230, "ignore_eos": True, "stream": True}))
    r = conn.getresponse()
    assert r.status == 200 and r.readline().startswith(b"data: ")
    conn.close()
    time.sleep(2.0)  # a request that ran on would finish its 230 tokens well within this
    assert _generated_tokens(group.server) - before < 230

