"""ONNX models on onnxruntime: the backend (``backend``), the execution providers a session gets
(``providers``) and the config options that map onto ORT's session and run options (``settings``)."""
