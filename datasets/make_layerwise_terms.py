"""Write models_store/layerwise/corpus-terms-v*.json.xz: the layer terms of every network the
shipped corpora time whole, which the layer-wise bases fit on (built again by name, they take
about half a minute on a first `adapt`). Run it after a corpus snapshot or the terms change;
an unchanged result leaves the file as it is.

    .venv/bin/python datasets/make_layerwise_terms.py
"""

from dlas_predict.crossdev.layerwise import write_shipped_terms


def main() -> None:
    path, changed = write_shipped_terms()
    print(f"{path}: {'written' if changed else 'unchanged'}")


if __name__ == "__main__":
    main()
