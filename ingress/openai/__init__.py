"""The OpenAI-compatible ingress (``conveyor ingress --protocol openai``): see docs/OPENAI.md."""
