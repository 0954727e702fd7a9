"""TensorFlow models for the tensorflow backend's tests: a ``tf.Module`` exported as a SavedModel
(``serving_default``) and the same function frozen into a GraphDef, with their configs.

Imported only where TensorFlow is (``pip install 'conveyor[tensorflow]'``). ``reference`` calls the
saved model in this process: what the served model must answer.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

from conveyor.deploy.example_repo import write_model

WEIGHTS = (np.arange(12, dtype=np.float32).reshape(4, 3) - 5) / 7

SIGNATURE = [tf.TensorSpec([None, 4], tf.float32, name="x"), tf.TensorSpec([None], tf.string, name="words")]


class Scorer(tf.Module):
    """Numbers and strings along one batch dimension: ``y = relu(x @ W)``, each word upper-cased, its length."""

    def __init__(self) -> None:
        super().__init__()
        self.w = tf.Variable(WEIGHTS)

    @tf.function(input_signature=SIGNATURE)
    def serve(self, x: tf.Tensor, words: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"y": tf.identity(tf.nn.relu(tf.matmul(x, self.w)), name="y"),
                "upper": tf.identity(tf.strings.upper(words), name="upper"),
                "lens": tf.identity(tf.strings.length(words), name="lens")}


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


def _model_dir(repo: str, name: str, config: str | None) -> str:
    return os.path.join(write_model(repo, name, config), "1")


def save_savedmodel(vdir: str, signature: str = "serving_default") -> str:
    module = Scorer()
    path = os.path.join(vdir, "model.savedmodel")
    tf.saved_model.save(module, path, signatures={signature: module.serve})
    return path


def save_graphdef(vdir: str) -> str:
    module = Scorer()  # a tf.function method holds its module weakly: keep it alive while tracing
    frozen = convert_variables_to_constants_v2(module.serve.get_concrete_function())
    path = os.path.join(vdir, "model.graphdef")
    with open(path, "wb") as f:
        f.write(frozen.graph.as_graph_def().SerializeToString())
    return path


def build(repo: str) -> dict[str, str]:
    """Every TensorFlow test model in ``repo``; by name, its model path."""
    paths = {
        # No config at all: the platform from the file, the config from the signature.
        "tf_auto": save_savedmodel(_model_dir(repo, "tf_auto", None)),
        "tf_declared": save_savedmodel(_model_dir(repo, "tf_declared", 'name: "tf_declared"\n' + DECLARED)),
        "tf_graphdef": save_graphdef(_model_dir(repo, "tf_graphdef", 'name: "tf_graphdef"\n' + GRAPHDEF)),
        # Saved without serving_default: Triton serves the first other signature.
        "tf_other_signature": save_savedmodel(_model_dir(repo, "tf_other_signature", 'backend: "tensorflow"\n'),
                                              signature="predict"),
    }
    # Refused, each with Triton's reason.
    save_savedmodel(_model_dir(repo, "tf_wrong_type", DECLARED.replace("TYPE_FP32 dims: [ 4 ]",
                                                                         "TYPE_FP64 dims: [ 4 ]")))
    save_graphdef(_model_dir(repo, "tf_graphdef_undeclared", 'platform: "tensorflow_graphdef"\nmax_batch_size: 8\n'))
    return paths


def reference(x: np.ndarray, words: np.ndarray) -> dict[str, np.ndarray]:
    """What the model computes, by calling the module's function here."""
    module = Scorer()
    out: dict[str, Any] = module.serve(tf.constant(x), tf.constant(words, dtype=tf.string))
    return {name: value.numpy() for name, value in out.items()}
