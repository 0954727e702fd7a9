"""Model repositories and what a model's config means before it loads: scanning (``scan``), config
completion (``onnx_autocomplete``, ``python_autocomplete``, ``default_groups``), ``--backend-config``,
namespacing, fields read but not acted on, and cloud repositories (``cloud/``)."""
