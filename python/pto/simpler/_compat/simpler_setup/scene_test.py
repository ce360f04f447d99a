"""``simpler_setup.scene_test`` on pto: see :mod:`pto.simpler._scene`."""

from pto.simpler._scene import (  # noqa: F401
    CallableNamespace,
    Scalar,
    SceneTestCase,
    TaskArgsBuilder,
    TensorArg,
    _rehosted_ref_for,
    scene_test,
)
