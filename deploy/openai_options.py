"""The OpenAI-compatible ingress's flags: off unless ``--openai-port`` is given.

``--lora-separator`` and ``--default-max-tokens`` are the flags of Triton's OpenAI
frontend (``python/openai/openai_frontend/main.py``), with its defaults.
"""

from __future__ import annotations

import argparse


def add_openai(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("OpenAI-compatible endpoint")
    g.add_argument("--openai-port", type=int, default=0,
                   help="serve /v1/models, /v1/completions and /v1/chat/completions on this port (default: off)")
    g.add_argument("--openai-address", default="", help="the OpenAI endpoint's address (default: --http-address)")
    g.add_argument("--openai-ingress", type=int, default=1,
                   help="OpenAI ingress processes (conveyor scale openai-ingress N)")
    g.add_argument("--lora-separator", default="",
                   help="a model name '<model><separator><adapter>' picks one of the model's LoRA adapters "
                        "(Triton's flag; default: off)")
    g.add_argument("--default-max-tokens", type=int, default=16,
                   help="max_tokens of a request that sets none (default 16, as Triton's OpenAI frontend)")


def openai_args(a: argparse.Namespace) -> list[str]:
    """The flags, as the supervisor passes them on to the ingress processes."""
    return ["--openai-port", str(a.openai_port), "--openai-address", a.openai_address,
            "--lora-separator", a.lora_separator, "--default-max-tokens", str(a.default_max_tokens)]
