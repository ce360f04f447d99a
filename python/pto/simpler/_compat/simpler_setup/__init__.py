"""pto's stand-in for ``simpler_setup`` (``python -m pto.simpler`` puts it first on the import
path)."""

from pto.simpler._scene import (  # noqa: F401
    CallableNamespace,
    Scalar,
    SceneTestCase,
    TaskArgsBuilder,
    TensorArg,
    scene_test,
)
