"""Models on OpenVINO (``backend: "openvino"``): the backend (``backend``), Triton's openvino_backend
parameters (``settings``) and config completion from the model, run in a child process by the router
(``autocomplete``). ``backend`` imports OpenVINO at import time (UNAVAILABLE when it is not installed:
``pip install 'conveyor[openvino]'``)."""
