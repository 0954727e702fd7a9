"""Model repositories and what a model's config means before it loads: scanning (``scan``), config
completion (``onnx_autocomplete`` with ``proto/onnx_graph.py``, ``python_autocomplete``, ``default_groups``),
``--backend-config``, fields read but not acted on, cloud repositories (``cloud/``), and
the repository agent that does the reading off the router's loop (``agent``, running ``prepare``).
What a scan makes (``ModelSpec``) and the checks a config must pass are ``router/spec/``."""
