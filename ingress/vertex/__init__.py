"""The Vertex AI endpoint: ``app.py``."""
