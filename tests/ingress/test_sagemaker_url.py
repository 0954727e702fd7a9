"""SageMaker's multi-model ``url`` checked as Triton checks it, without a group: never a kernel tree
(``/dev``, ``/proc``, ``/sys``) however spelled or linked, and of the form ``<root>/<hash>/model[/<subdir>]``.
Against a group: tests/e2e/test_attack_paths.py."""

from __future__ import annotations

import os

import pytest

from conveyor.ingress.sagemaker.multi_model import checked_url
from conveyor.proto.errors import ConveyorError, Status

LEVEL = "unit"


@pytest.mark.parametrize("url", ["/proc", "/proc/self", "//proc/self", "///proc/self", "/./proc/self",
                                 "/opt/../proc/self", "/opt/ml/models/h/model/../../../../../sys/kernel",
                                 "//dev//shm/x", "/dev", "/sys/"])
def test_kernel_trees_are_refused_however_spelled(url: str) -> None:
    with pytest.raises(ConveyorError) as err:
        checked_url(url)
    assert err.value.status is Status.INVALID_ARG
    assert err.value.message == f'Invalid URL: {url}. "url" property value cannot start with /dev/, /proc/, or /sys/.'


def test_a_link_to_a_kernel_tree_is_refused(tmp_path: os.PathLike[str]) -> None:
    root = os.path.join(str(tmp_path), "models")
    os.makedirs(os.path.join(root, "h"))
    os.symlink("/proc/self", os.path.join(root, "h", "model"))
    with pytest.raises(ConveyorError, match="cannot start with /dev/, /proc/, or /sys/"):
        checked_url(os.path.join(root, "h", "model"), root)


@pytest.mark.parametrize("url", ["/tmp/x", "/opt/ml/models/h", "/opt/ml/models/h/other", "/opt/ml/models/h/model/a/b",
                                 "/opt/ml/models/a b/model", "/opt/ml/modelsX/h/model", "s3://b/h/model", "h/model"])
def test_anything_but_tritons_form_is_refused(url: str) -> None:
    with pytest.raises(ConveyorError) as err:
        checked_url(url)
    assert err.value.message == (f"Invalid \"url\" '{url}': expected a path of the form "
                                 "/opt/ml/models/<hash>/model[/<subdir>]")


@pytest.mark.parametrize(("url", "path"), [
    ("/opt/ml/models/h/model", "/opt/ml/models/h/model"),
    ("/opt/ml/models/h/model/", "/opt/ml/models/h/model"),
    ("//opt/ml/models/h.1/./model/sub_2", "/opt/ml/models/h.1/model/sub_2"),
    ("/opt/ml/models/x/../h/model", "/opt/ml/models/h/model"),
])
def test_tritons_form_however_spelled(url: str, path: str) -> None:
    assert checked_url(url) == path
    assert checked_url(url.replace("/opt/ml/models", "/srv/m"), "/srv/m/") == path.replace("/opt/ml/models", "/srv/m")
