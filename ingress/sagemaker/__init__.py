"""The SageMaker endpoint: ``app.py`` (routes), ``multi_model.py`` (the multi-model API)."""
