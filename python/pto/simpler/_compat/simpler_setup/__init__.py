"""pto's stand-in for ``simpler_setup`` (``python -m pto.simpler`` puts it first on the import
path)."""

# Imported through the submodule first, so that the package's name ``scene_test`` is the
# decorator, not the submodule of the same name.
from .scene_test import (  # noqa: F401
    CallableNamespace,
    Scalar,
    SceneTestCase,
    TaskArgsBuilder,
    TensorArg,
    scene_test,
)
