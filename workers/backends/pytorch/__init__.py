"""TorchScript models (``platform: "pytorch_libtorch"`` / ``backend: "pytorch"``) on torch: the backend
(``backend``), Triton's tensor naming rules (``naming``), its backend parameters (``settings``), weight
sharing between instances (``sharing``) and ``torch.compile`` (``compile``, ``compile_settings``).

Only ``backend`` imports torch at import time (UNAVAILABLE when it is not installed)."""
