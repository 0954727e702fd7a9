"""The forms the OpenAI port answers errors in (``--openai-error-form``): OpenAI's API's and vLLM's
(``{"error": {...}}``), or Triton's OpenAI frontend's (FastAPI's ``{"detail": ...}``, 422 for a body outside
its schema). ``errors.py`` renders both."""

OPENAI = "openai"
TRITON = "triton"
ERROR_FORMS = (OPENAI, TRITON)
