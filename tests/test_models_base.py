"""The one interface of the learned models (dlas_predict.models.base)."""
import inspect
from statistics import NormalDist

import numpy as np
import pytest

from dlas_predict.models.base import CostModel, at_coverage, check_coverage


def _all_models() -> list[type]:
    """Every concrete CostModel of the package."""
    import dlas_predict.models.accuracy  # noqa: F401  (registers the subclasses)
    import dlas_predict.models.costmodel  # noqa: F401
    import dlas_predict.models.netmodel  # noqa: F401
    import dlas_predict.models.ortmodel  # noqa: F401

    out, todo = [], [CostModel]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if not inspect.isabstract(sub):
                out.append(sub)
    return out


def test_every_model_follows_the_interface():
    """Hyperparameters in the constructor, ``fit`` an instance method returning the model,
    ``predict_interval`` taking a coverage, ``save(directory)`` and ``load(directory)``."""
    models = _all_models()
    assert {m.__name__ for m in models} >= {
        "LayerCostModel", "StageCostModel", "RooflineBaseline", "MacsLinearBaseline",
        "NetworkCostModel", "OrtLatencyModel", "TuningTimeModel", "AccuracyCostModel"}
    for cls in models:
        assert not isinstance(inspect.getattr_static(cls, "fit"), classmethod), cls
        assert isinstance(inspect.getattr_static(cls, "load"), classmethod), cls
        assert list(inspect.signature(cls.save).parameters) == ["self", "directory"], cls
        load = inspect.signature(cls.load).parameters
        assert list(load)[0] == "directory" and all(
            p.default is not inspect.Parameter.empty for p in list(load.values())[1:]), cls
        q = inspect.signature(cls.predict_interval).parameters.get("q")
        assert q is not None and q.default == 0.8, cls
        cls()  # every constructor argument has a default: nothing learned is passed in
        learned = [n for n in getattr(cls, "__dataclass_fields__", {})
                   if not cls.__dataclass_fields__[n].init]
        assert learned and all(n.endswith("_") for n in learned), cls


def test_an_interval_at_its_own_coverage_is_unchanged_and_others_scale_as_a_normal():
    mid, low, high = np.array([2.0, 10.0]), np.array([1.0, 8.0]), np.array([5.0, 11.0])
    same = at_coverage(mid, low, high, 0.8)
    assert np.array_equal(same[0], low) and np.array_equal(same[1], high)
    k = NormalDist().inv_cdf(0.975) / NormalDist().inv_cdf(0.9)
    lo, hi = at_coverage(mid, low, high, 0.95)
    np.testing.assert_allclose(np.log(mid / lo), k * np.log(mid / low))
    np.testing.assert_allclose(np.log(hi / mid), k * np.log(high / mid))
    lo, hi = at_coverage(mid, low, high, 0.95, log=False)
    np.testing.assert_allclose(mid - lo, k * (mid - low))
    np.testing.assert_allclose(hi - mid, k * (high - mid))
    for q in (0, 1, -0.1, 2):
        with pytest.raises(ValueError, match="coverage"):
            check_coverage(q)
