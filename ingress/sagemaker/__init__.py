"""The SageMaker endpoint: ``app.py`` (routes), ``multi_model.py`` (the multi-model API).

What deploy/ reads for its flags lives here, not in those modules: every actor parses the same flags, and
importing the routes would load falcon into the router, the workers and the gRPC ingress."""

DEFAULT_MODEL_ROOT = "/opt/ml/models"  # where SageMaker unpacks a multi-model endpoint's archives
