"""The vLLM backend (``backend: "vllm"``): Triton's vllm_backend repository layout on vLLM's engine.

``<version>/model.json`` holds the engine arguments, ``<version>/multi_lora.json`` the LoRA adapters
(name -> local path). The engine runs in the worker process on its own event-loop thread
(``engine.py``); each request is translated (``request.py``), handed to it, and answered through
its response channel as the engine produces tokens (``outputs.py``); the engine's statistics become
Triton's ``vllm:`` metrics (``metrics.py``). On a host with few cores the engine's processes run
at a lower CPU priority than the worker (``priority.py``). vLLM is imported only when such a model
loads.
"""
