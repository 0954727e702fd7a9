"""vLLM's own outputs for the tests that compare Conveyor with vLLM (tests/ingress/openai/
test_openai_vllm_e2e.py, tests/workers/backends/vllm/test_vllm_e2e.py), computed once per test
session in a child process (this module run as a script: its engines and memory go with it):
``LLM.generate`` greedy per adapter, one seeded sampled request, token-id prompts,
``prompt_logprobs``, and ``LLM.embed`` with the pooling model's engine arguments. One process for
both files: each vLLM engine costs this 2-core host some 20 s to import and start."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from tests.support import tiny_llama

# A small engine: the pooling model holds no sequence past its one step (vLLM's CPU KV cache needs some).
EMBED_ENGINE = {"runner": "pooling", "enable_lora": False, "max_num_seqs": 8, "kv_cache_memory_bytes": 16 << 20}
EMBED_INPUTS = ["the quick brown fox", "hello world", "tokens stream out"]
MAX_TOKENS = 12
PROMPT = "the quick brown"
OTHER = "hello world"  # a second prompt, of another greedy answer
TOP = 1  # alternatives per token asked with ``echo``
CHAT = [{"role": "user", "content": "hello world"}]
N, SEED, TEMPERATURE, SAMPLED_TOKENS = 3, 7, 2.0, 8  # a sampled request: the tiny model is peaked
# test_vllm_e2e.py's prompts (Triton's paths), generated together per adapter as ``LLM.generate`` batches them.
TRITON_PROMPTS = ["the quick", "hello world", "tokens stream"]


@dataclass
class Reference:
    """vLLM's own outputs: greedy (text, output token count, prompt token count) per case, and the
    ``N`` texts of one seeded sampled request."""

    completion: dict[str | None, tuple[str, int, int]]
    chat: dict[str | None, tuple[str, int, int]]
    sampled: list[str]
    embeddings: list[list[float]]  # ``LLM.embed`` of EMBED_INPUTS, then of the first one's token ids
    embed_tokens: list[int]  # their prompts' token counts
    token_ids: list[int]  # the first input's ids
    prompt_ids: list[list[int]]  # PROMPT's and OTHER's ids, as vLLM tokenizes a completion's prompt
    other: str  # OTHER's greedy text
    echo: dict[str, Any]  # PROMPT's ids with prompt logprobs: text, first_token, prompt, output (``_listed``)
    triton: dict[str, list[dict[str, Any]]]  # per adapter ("" the base): TRITON_PROMPTS' text and token_ids


def reference(tiny: tiny_llama.TinyLlama) -> Reference:
    """Computed in a child process (this module run as a script), once per model for the session."""
    return _reference(str(tiny.model_dir), json.dumps({k: str(v) for k, v in tiny.adapters.items()}))


@functools.cache
def _reference(model_dir: str, adapters: str) -> Reference:
    out = subprocess.run([sys.executable, "-m", __name__, model_dir, adapters],
                         capture_output=True, text=True, timeout=300, check=True,
                         env={**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    doc = json.loads(out.stdout.splitlines()[-1])
    completion, chat = ({None if k == "" else k: tuple(v) for k, v in doc[part].items()}
                        for part in ("completion", "chat"))
    return Reference(completion, chat, doc["sampled"], doc["embed"]["vectors"], doc["embed"]["tokens"],
                     doc["embed"]["ids"], doc["ids"]["prompts"], doc["ids"]["other"], doc["ids"]["echo"],
                     doc["triton"])


def _vllm_outputs(model_dir: str, adapters: dict[str, str]) -> dict[str, object]:
    out = _vllm_generations(model_dir, adapters)  # its engine gone on return: one engine at a time here
    out["embed"] = _vllm_embeddings(model_dir)
    return out


def _vllm_generations(model_dir: str, adapters: dict[str, str]) -> dict[str, object]:
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest

    chat_prompt = AutoTokenizer.from_pretrained(model_dir).apply_chat_template(
        CHAT, tokenize=False, add_generation_prompt=True)
    # The engine arguments of tiny_llama.write_repository's model.json.
    llm = LLM(model=model_dir, enforce_eager=True, dtype="float32", max_model_len=256, enable_lora=True,
              max_loras=2, max_lora_rank=8, max_num_seqs=32, kv_cache_memory_bytes=64 << 20)
    greedy = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    loras = {name: LoRARequest(name, i + 1, path) for i, (name, path) in enumerate(adapters.items())}

    def run(prompt: str, adapter: str) -> list[object]:
        out = llm.generate([prompt], greedy, lora_request=loras.get(adapter), use_tqdm=False)[0]
        return [out.outputs[0].text, len(out.outputs[0].token_ids), len(out.prompt_token_ids)]

    cases = ("", *adapters)
    sampling = SamplingParams(n=N, seed=SEED, temperature=TEMPERATURE, max_tokens=SAMPLED_TOKENS)
    sampled = llm.generate([PROMPT], sampling, use_tqdm=False)[0]
    tokenizer = llm.get_tokenizer()
    ids = [tokenizer(p)["input_ids"] for p in (PROMPT, OTHER)]
    other = llm.generate([TokensPrompt(prompt_token_ids=ids[1])], greedy, use_tqdm=False)[0].outputs[0].text
    echoed = llm.generate([TokensPrompt(prompt_token_ids=ids[0])], SamplingParams(
        temperature=0, max_tokens=MAX_TOKENS, logprobs=TOP, prompt_logprobs=TOP), use_tqdm=False)[0]
    echo = {"text": tokenizer.decode(ids[0]) + echoed.outputs[0].text, "first_token": tokenizer.decode(ids[0][0]),
            "prompt": [listed(step) for step in echoed.prompt_logprobs[1:]],
            "output": [listed(step) for step in echoed.outputs[0].logprobs]}
    triton = {a: [{"text": r.outputs[0].text, "token_ids": list(r.outputs[0].token_ids)}
                  for r in llm.generate(TRITON_PROMPTS, greedy, lora_request=loras.get(a), use_tqdm=False)]
              for a in cases}
    return {"completion": {a: run(PROMPT, a) for a in cases}, "chat": {a: run(chat_prompt, a) for a in cases},
            "triton": triton,
            "sampled": [c.text for c in sorted(sampled.outputs, key=lambda c: c.index)],
            "ids": {"prompts": ids, "other": other, "echo": echo}}


def listed(step: dict[int, Any]) -> list[tuple[str, float]]:
    """One position's logprobs as vLLM's server lists them in a completion: the token first, then the
    ``TOP`` most likely, ``TOP`` + 1 entries at most (``_create_completion_logprobs``)."""
    return [(lp.decoded_token, lp.logprob) for lp in list(step.values())[:TOP + 1]]


def _vllm_embeddings(model_dir: str) -> dict[str, object]:
    """``LLM.embed`` with the pooling model's engine arguments (those of its model.json)."""
    import gc

    from transformers import AutoTokenizer
    from vllm import LLM
    from vllm.inputs import TokensPrompt

    gc.collect()
    ids = AutoTokenizer.from_pretrained(model_dir)(EMBED_INPUTS[0])["input_ids"]
    engine = {k: v for k, v in EMBED_ENGINE.items() if k != "enable_lora"}
    llm = LLM(model=model_dir, enforce_eager=True, dtype="float32", max_model_len=256, **engine)
    found = llm.embed([*EMBED_INPUTS, TokensPrompt(prompt_token_ids=ids)], use_tqdm=False)
    return {"vectors": [r.outputs.embedding for r in found], "tokens": [len(r.prompt_token_ids) for r in found],
            "ids": ids}


if __name__ == "__main__":
    print(json.dumps(_vllm_outputs(sys.argv[1], json.loads(sys.argv[2]))))
