"""TensorFlow models for the tensorflow backend's tests: a ``tf.Module`` exported as a SavedModel
(``serving_default``; a second copy with only a ``predict`` signature) and the same function frozen
into a GraphDef, with their configs, built on the fly (``build``, which imports TensorFlow).
``reference`` calls the exported SavedModel in this process: what the served models must answer.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
from typing import Any

import numpy as np

from conveyor.deploy.example_repo import write_model

SAVED, PREDICT_ONLY, GRAPHDEF_FILE = "scorer.savedmodel", "scorer_predict.savedmodel", "scorer.graphdef"
# A GraphDef whose weights are a variable, set by its "init" operation: served with Triton's TF_INIT_OPS_FILE.
INIT_GRAPHDEF_FILE = "weights.graphdef"
INIT_CONFIG = """platform: "tensorflow_graphdef"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] } ]
parameters { key: "TF_INIT_OPS_FILE" value { string_value: "init_ops.json" } }
"""

WEIGHTS = (np.arange(12, dtype=np.float32).reshape(4, 3) - 5) / 7

DECLARED = """platform: "tensorflow_savedmodel"
max_batch_size: 8
input [
  { name: "x" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "words" data_type: TYPE_STRING dims: [ 1 ] reshape: { shape: [ ] } }
]
output [
  { name: "y" data_type: TYPE_FP32 dims: [ 3 ] },
  { name: "upper" data_type: TYPE_STRING dims: [ 1 ] reshape: { shape: [ ] } },
  { name: "lens" data_type: TYPE_INT32 dims: [ 1 ] reshape: { shape: [ ] } }
]
dynamic_batching { max_queue_delay_microseconds: 2000 }
parameters { key: "TF_NUM_INTRA_THREADS" value { string_value: "1" } }
parameters { key: "TF_NUM_INTER_THREADS" value { string_value: "1" } }
"""
GRAPHDEF = DECLARED.replace("tensorflow_savedmodel", "tensorflow_graphdef")


def _model(repo: str, name: str, config: str | None, source: str) -> str:
    """Model ``name`` in ``repo`` serving the exported file ``source`` (its version 1's model path)."""
    vdir = os.path.join(write_model(repo, name, config), "1")
    target = os.path.join(vdir, "model.graphdef" if source.endswith(".graphdef") else "model.savedmodel")
    if os.path.isdir(os.path.join(_exported, source)):
        shutil.copytree(os.path.join(_exported, source), target)
    else:
        shutil.copyfile(os.path.join(_exported, source), target)
    return target


_exported = ""  # where ``build`` exported the models (``reference`` calls the SavedModel there)


def build(repo: str) -> dict[str, str]:
    """Every TensorFlow test model in ``repo``; by name of those that serve, its model path."""
    global _exported
    _exported = os.path.join(repo, ".exported")  # a folder the repository scan skips (a dot name)
    _export(_exported)
    paths = {
        # No config at all: the platform from the file, the config from the signature (the one
        # model whose config the router completes: each completion is a child importing TensorFlow).
        "tf_auto": _model(repo, "tf_auto", None, SAVED),
        "tf_declared": _model(repo, "tf_declared", 'name: "tf_declared"\n' + DECLARED, SAVED),
        "tf_graphdef": _model(repo, "tf_graphdef", 'name: "tf_graphdef"\n' + GRAPHDEF, GRAPHDEF_FILE),
        # Saved without serving_default: Triton serves the first other signature.
        "tf_other_signature": _model(repo, "tf_other_signature", 'name: "tf_other_signature"\n' + DECLARED,
                                     PREDICT_ONLY),
    }
    # Refused, each with Triton's reason.
    _model(repo, "tf_wrong_type", DECLARED.replace("TYPE_FP32 dims: [ 4 ]", "TYPE_FP64 dims: [ 4 ]"), SAVED)
    _model(repo, "tf_missing_signature",
           DECLARED + 'parameters { key: "TF_SIGNATURE_DEF" value { string_value: "predict" } }\n', SAVED)
    _model(repo, "tf_graphdef_undeclared", 'platform: "tensorflow_graphdef"\nmax_batch_size: 8\n', GRAPHDEF_FILE)
    # TF_INIT_OPS_FILE as Triton's README places it, in the version folder; then the same without the file.
    paths["tf_graphdef_init"] = _model(repo, "tf_graphdef_init", INIT_CONFIG, INIT_GRAPHDEF_FILE)
    with open(os.path.join(os.path.dirname(paths["tf_graphdef_init"]), "init_ops.json"), "w") as f:
        json.dump({"init_ops": ["init"]}, f)
    _model(repo, "tf_graphdef_no_init_file", INIT_CONFIG, INIT_GRAPHDEF_FILE)
    # Declares x alone, but its output upper is computed from words: no session run could feed it.
    _model(repo, "tf_graphdef_unfed", GRAPHDEF.replace(
        '  { name: "words" data_type: TYPE_STRING dims: [ 1 ] reshape: { shape: [ ] } }\n', "").replace(
        '  { name: "x" data_type: TYPE_FP32 dims: [ 4 ] },', '  { name: "x" data_type: TYPE_FP32 dims: [ 4 ] }'),
        GRAPHDEF_FILE)
    return paths


def reference(x: np.ndarray, words: np.ndarray) -> dict[str, np.ndarray]:
    """What TensorFlow answers, the exported SavedModel's ``serving_default`` called here."""
    import tensorflow as tf

    out = _loaded().signatures["serving_default"](x=tf.constant(x), words=tf.constant(list(words)))
    return {name: value.numpy() for name, value in out.items()}


@functools.cache
def _loaded() -> Any:
    import tensorflow as tf

    return tf.saved_model.load(os.path.join(_exported, SAVED))


def _export(data: str) -> None:
    """Export the models into ``data``."""
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    signature = [tf.TensorSpec([None, 4], tf.float32, name="x"), tf.TensorSpec([None], tf.string, name="words")]

    class Scorer(tf.Module):
        """Numbers and strings along one batch dimension: ``y = relu(x @ W)``, each word upper-cased, its length."""

        def __init__(self) -> None:
            super().__init__()
            self.w = tf.Variable(WEIGHTS)

        @tf.function(input_signature=signature)
        def serve(self, x: Any, words: Any) -> dict[str, Any]:
            return {"y": tf.identity(tf.nn.relu(tf.matmul(x, self.w)), name="y"),
                    "upper": tf.identity(tf.strings.upper(words), name="upper"),
                    "lens": tf.identity(tf.strings.length(words), name="lens")}

    shutil.rmtree(data, ignore_errors=True)
    os.makedirs(data)
    for name, key in ((SAVED, "serving_default"), (PREDICT_ONLY, "predict")):
        module = Scorer()
        tf.saved_model.save(module, os.path.join(data, name), signatures={key: module.serve})
    module = Scorer()  # a tf.function method holds its module weakly: keep it alive while tracing
    frozen = convert_variables_to_constants_v2(module.serve.get_concrete_function())
    with open(os.path.join(data, GRAPHDEF_FILE), "wb") as f:
        f.write(frozen.graph.as_graph_def().SerializeToString())
    graph = tf.Graph()
    with graph.as_default():  # TensorFlow 1's way: a variable that holds nothing until "init" runs
        x = tf.compat.v1.placeholder(tf.float32, [None, 4], name="x")
        w = tf.compat.v1.get_variable("w", initializer=tf.constant(WEIGHTS), use_resource=True)
        tf.identity(tf.matmul(x, w), name="y")
        tf.compat.v1.global_variables_initializer()  # the operation "init"
    with open(os.path.join(data, INIT_GRAPHDEF_FILE), "wb") as f:
        f.write(graph.as_graph_def().SerializeToString())

