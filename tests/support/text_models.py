"""Generative Python models that are not vLLM's: Triton's ``text_input`` / ``text_output`` contract with
TensorRT-LLM's per-field inputs (``max_tokens``, ``stop_words``, ``temperature``) and no
``sampling_parameters``, no token counts, no finish reason. Each answers the prompt's words reversed,
one word per "token" (the first bare, the others after a space), at most ``max_tokens`` of them, stopping
before a word in ``stop_words``: deterministic, and it shows the prompt the model received.

* ``STREAMING``: decoupled, one response per word when ``stream`` is true (else one with the whole
  text); unbatched, its inputs in two dimensions (``[1, 1]``, ``[1, -1]``: Triton's tool_stream_py's
  shapes); its tokenizer (a word-level one with a chat template) lies in ``<model>/tokenizer``, named
  by the config's ``tokenizer`` parameter.
* ``PLAIN``: not decoupled, batched (``max_batch_size`` 4): one answer per request; no tokenizer, so chat
  writes a plain transcript and there is no ``usage``.
"""

from __future__ import annotations

import os
import textwrap

from conveyor.deploy.example_repo import write_model

STREAMING = "any_stream"
PLAIN = "any_plain"
VOCAB = ("<unk>", "<s>", "<|user|>", "<|assistant|>", "<|system|>", "hello", "world", "hi", "there")
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")

MODEL = '''
import json

import numpy as np
import triton_python_backend_utils as pb_utils


def _values(request, name):
    t = pb_utils.get_input_tensor_by_name(request, name)
    return [] if t is None else list(t.as_numpy().reshape(-1))


class TritonPythonModel:
    def initialize(self, args):
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(json.loads(args["model_config"]))

    def execute(self, requests):
        out = []
        for request in requests:
            prompt = _values(request, "text_input")[0].decode()
            limit = int((_values(request, "max_tokens") or [16])[0])
            stop = {w.decode() for w in _values(request, "stop_words")}
            words = []
            for word in reversed(prompt.split()):
                if word in stop or len(words) == limit:
                    break
                words.append(word)
            pieces = [w if i == 0 else " " + w for i, w in enumerate(words)]
            if not self.decoupled:
                out.append(self._response("".join(pieces), batched=True))
                continue
            sender = request.get_response_sender()
            if bool((_values(request, "stream") or [False])[0]):
                for piece in pieces:
                    sender.send(self._response(piece))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                sender.send(self._response("".join(pieces)), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return out if not self.decoupled else None

    def _response(self, text, batched=False):
        data = np.array([[text.encode()]] if batched else [text.encode()], dtype=object)
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("text_output", data)])
'''

CONFIG = '''
name: "{name}"
backend: "python"
max_batch_size: {batch}
{policy}
input [
  {{ name: "text_input" data_type: TYPE_STRING dims: [ {one} ] }},
  {{ name: "stream" data_type: TYPE_BOOL dims: [ {one} ] optional: true }},
  {{ name: "max_tokens" data_type: TYPE_INT32 dims: [ {one} ] optional: true }},
  {{ name: "temperature" data_type: TYPE_FP32 dims: [ {one} ] optional: true }},
  {{ name: "stop_words" data_type: TYPE_STRING dims: [ {many} ] optional: true }}
]
output [ {{ name: "text_output" data_type: TYPE_STRING dims: [ -1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
{parameters}
'''


def write_word_tokenizer(path: str) -> None:
    """A word-level tokenizer over ``VOCAB`` (whitespace-split, ``<s>`` added as BOS) with a chat
    template, saved as Hugging Face files: trained on nothing, fetched from nowhere."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(path)


def build(repo: str) -> None:
    streaming = write_model(repo, STREAMING, CONFIG.format(
        name=STREAMING, batch=0, policy="model_transaction_policy { decoupled: true }", one="1, 1", many="1, -1",
        parameters='parameters { key: "tokenizer" value: { string_value: "tokenizer" } }'),
        {"model.py": textwrap.dedent(MODEL)})
    write_word_tokenizer(os.path.join(streaming, "tokenizer"))  # beside the config: the model's directory
    write_model(repo, PLAIN, CONFIG.format(name=PLAIN, batch=4, policy="", parameters="", one="1", many="-1"),
                {"model.py": textwrap.dedent(MODEL)})
