"""TensorFlow SavedModel and GraphDef models (``platform: "tensorflow_savedmodel"`` /
``"tensorflow_graphdef"``): the backend (``backend``), Triton's TensorFlow parameters (``settings``),
the signature served and the config checks (``signature``), and config completion from a SavedModel,
run by the router in a child process (``autocomplete``). TensorFlow is imported only to load or complete
a model (``pip install 'conveyor[tensorflow]'``)."""
