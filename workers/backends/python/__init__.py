"""Triton Python models (``backend: "python"``), run in the worker process: the backend (``backend``),
importing a ``model.py`` (``model_import``), BLS calls (``bls``, ``bls_answers``), ``auto_complete_config``
in a child process (``autocomplete``), and Triton's ``triton_python_backend_utils`` (``pb_utils/``)."""
