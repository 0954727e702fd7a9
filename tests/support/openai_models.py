"""A stand-in for a vLLM model in the OpenAI ingress's protocol tests: a decoupled
Python model with Triton's vLLM model contract (the same inputs and outputs), whose
"tokens" are the prompt's words, fast and deterministic; and a tokenizer with a chat
template, so chat requests are written as a real model's would be.

Generation: choice i repeats the prompt's words, starting at word i, one per token,
each preceded by a space (``<adapter>:`` before each word with a LoRA adapter), until
``max_tokens`` ("length") or a word in ``stop`` ("stop", the word left out). Its tool-call parser is
``hermes``: a prompt holding ``<tool_call>{...}</tool_call>`` is answered with that call. A prompt
holding ``slow`` waits 50 ms per token and, cancelled, writes ``cancelled`` into its
version directory (the disconnect test reads it).
"""

from __future__ import annotations

import json
import os
import textwrap

from conveyor.deploy.example_repo import write_model

ADAPTERS = ("sql", "poet")

MODEL = '''
import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils

ADAPTERS = ("sql", "poet")


def _scalar(request, name, default):
    t = pb_utils.get_input_tensor_by_name(request, name)
    return default if t is None else t.as_numpy().reshape(-1)[0]


class TritonPythonModel:
    def initialize(self, args):
        self.dir = os.path.join(args["model_repository"], args["model_version"])

    def execute(self, requests):
        for request in requests:
            self._run(request)
        return None

    def _run(self, request):
        sender = request.get_response_sender()
        prompt = _scalar(request, "text_input", b"").decode()
        stream = bool(_scalar(request, "stream", False))
        params = json.loads(_scalar(request, "sampling_parameters", b"{}"))
        returns = {k: bool(_scalar(request, "return_" + k, False))
                   for k in ("num_input_tokens", "num_output_tokens", "finish_reason")}
        lora = params.get("lora_name")
        if lora is not None and lora not in ADAPTERS:
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                f"LoRA {lora} is not supported, we currently support {list(ADAPTERS)}")),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        words = prompt.split() or ["?"]
        n, max_tokens, stop = int(params.get("n", 1)), int(params.get("max_tokens", 16)), params.get("stop", [])
        delay = 0.05 if "slow" in words else 0.0
        texts, finish = [""] * n, [None] * n
        for step in range(max_tokens):
            if delay:
                time.sleep(delay)
                if sender.is_cancelled():
                    open(os.path.join(self.dir, "cancelled"), "w").close()
                    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    return
            new = [""] * n
            for i in range(n):
                if finish[i]:
                    continue
                word = words[(i + step) % len(words)]
                if word in stop:
                    finish[i] = "stop"
                    continue
                new[i] = " " + (f"{lora}:" if lora else "") + word
                if step + 1 == max_tokens:
                    finish[i] = "length"
            texts = [t + d for t, d in zip(texts, new)]
            done = all(finish)
            if stream:
                self._send(sender, new, finish, [1 if d else 0 for d in new], len(words), returns, done)
            if done:
                break
        if not stream:
            self._send(sender, texts, finish, [len(t.split()) for t in texts], len(words), returns, True)

    def _send(self, sender, texts, finish, counts, prompt_tokens, returns, final):
        out = [pb_utils.Tensor("text_output", np.array([t.encode() for t in texts], dtype=object))]
        if returns["finish_reason"]:
            out.append(pb_utils.Tensor("finish_reason", np.array([str(f).encode() for f in finish], dtype=object)))
        if returns["num_input_tokens"]:
            out.append(pb_utils.Tensor("num_input_tokens", np.array(prompt_tokens, dtype=np.uint32)))
        if returns["num_output_tokens"]:
            out.append(pb_utils.Tensor("num_output_tokens", np.array(counts, dtype=np.uint32)))
        flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
        sender.send(pb_utils.InferenceResponse(output_tensors=out), flags=flags)
'''

CONFIG = '''
name: "{name}"
backend: "python"
max_batch_size: 0
model_transaction_policy {{ decoupled: true }}
input [
  {{ name: "text_input" data_type: TYPE_STRING dims: [ 1 ] }},
  {{ name: "stream" data_type: TYPE_BOOL dims: [ 1 ] optional: true }},
  {{ name: "sampling_parameters" data_type: TYPE_STRING dims: [ 1 ] optional: true }},
  {{ name: "exclude_input_in_output" data_type: TYPE_BOOL dims: [ 1 ] optional: true }},
  {{ name: "return_finish_reason" data_type: TYPE_BOOL dims: [ 1 ] optional: true }},
  {{ name: "return_num_input_tokens" data_type: TYPE_BOOL dims: [ 1 ] optional: true }},
  {{ name: "return_num_output_tokens" data_type: TYPE_BOOL dims: [ 1 ] optional: true }}
]
output [
  {{ name: "text_output" data_type: TYPE_STRING dims: [ -1 ] }},
  {{ name: "finish_reason" data_type: TYPE_STRING dims: [ -1 ] }},
  {{ name: "num_input_tokens" data_type: TYPE_UINT32 dims: [ 1 ] }},
  {{ name: "num_output_tokens" data_type: TYPE_UINT32 dims: [ -1 ] }}
]
instance_group [ {{ count: 2 kind: KIND_CPU }} ]
parameters {{ key: "TOOL_CALL_PARSER" value: {{ string_value: "hermes" }} }}
'''

CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def write_tokenizer(path: str) -> None:
    """A word-level tokenizer with a chat template, saved as Hugging Face files."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(path)


def build(repo: str, name: str = "fake_llm") -> None:
    model_dir = write_model(repo, name, CONFIG.format(name=name), {
        "model.py": textwrap.dedent(MODEL),
        # relative: found in the version directory
        "model.json": json.dumps({"model": "tokenizer", "enable_lora": True}),
        "multi_lora.json": json.dumps({a: f"/adapters/{a}" for a in ADAPTERS}),
    })
    write_tokenizer(os.path.join(model_dir, "1", "tokenizer"))
