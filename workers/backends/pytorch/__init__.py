"""PyTorch models on torch: TorchScript (``platform: "pytorch_libtorch"`` / ``backend: "pytorch"``, the
backend in ``backend``) and PyTorch 2 packages (``platform: "torch_aoti"``, ``model.pt2``: ``aoti``);
Triton's tensor naming rules (``naming``), its backend parameters (``settings``), weight sharing between
instances (``sharing``) and ``torch.compile`` (``compile``, ``compile_settings``).

Only ``backend`` and ``aoti`` import torch at import time (UNAVAILABLE when it is not installed)."""
