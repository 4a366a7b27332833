"""Training a device's models from a store (dlas_predict.models.train)."""


def test_train_never_writes_a_new_cpus_models_over_another_machines():
    """``train``'s default folder for a machine: its own under models_store/machines/ where
    models_store/NAME holds another machine's models, models_store/NAME where it holds this
    machine's."""
    import json

    from dlas_predict.models.train import default_model_dir
    from dlas_predict.paths import MACHINES, MODELS_STORE

    shipped = json.loads((MODELS_STORE / "local" / "layer.json").read_text())[
        "device_fingerprint"]
    assert default_model_dir("local", shipped) == MODELS_STORE / "local"
    assert default_model_dir("local", "f" * 16) == MODELS_STORE / MACHINES / ("f" * 16) / "local"
