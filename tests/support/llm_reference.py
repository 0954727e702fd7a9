"""vLLM's own ``LLM.generate`` on the tiny model, in a process of its own (``python -m``): the
reference the tests compare Conveyor's outputs with. Reads a JSON request on stdin, writes
``{"<adapter or ''>": [{"text": ..., "token_ids": [...]}, ...]}`` (one entry per prompt) into the
file its argument names (vLLM logs on stdout)."""

from __future__ import annotations

import json
import sys
from typing import Any


def main() -> None:
    spec = json.load(sys.stdin)
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    llm = LLM(**spec["engine"])
    params = SamplingParams(**spec["sampling"])
    out: dict[str, Any] = {}
    for i, (name, path) in enumerate([("", None), *spec["adapters"].items()]):
        lora = LoRARequest(name, i, path) if path else None
        results = llm.generate(spec["prompts"], params, lora_request=lora, use_tqdm=False)
        out[name] = [{"text": r.outputs[0].text, "token_ids": list(r.outputs[0].token_ids)} for r in results]
    with open(sys.argv[1], "w", encoding="utf-8") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
