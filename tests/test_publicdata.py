"""data fetch: public data downloaded from a server on loopback (a mirror of the upstream
paths), checked against pinned sizes and sha256, converted into DLAS_HOME, and read from
there; a truncated file, a wrong checksum and no network each fail cleanly."""
import functools
import gzip
import hashlib
import http.server
import json
import threading
from pathlib import Path

import pytest

from conftest import SHARED_DATA, assert_clean_error, run_cli
from dlas_predict import publicdata as P


@pytest.fixture()
def mirror(tmp_path):
    """A folder served over HTTP on loopback; yields (folder, base URL)."""
    root = tmp_path / "mirror"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


def _pin(root: Path, name: str, files: dict[str, bytes], monkeypatch) -> None:
    """Write ``files`` under ``root`` and pin them as source ``name``'s."""
    pinned = []
    for path, data in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
        pinned.append((path, len(data), hashlib.sha256(data).hexdigest()))
    up = P.UPSTREAM[name]
    monkeypatch.setitem(P.UPSTREAM, name, P.Upstream(name, up.repository, up.commit,
                                                      tuple(pinned)))


@pytest.fixture()
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("DLAS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DLAS_SHARED_DATA", str(tmp_path / "no-shared-data"))
    return tmp_path / "home"


def test_help_is_fetched_checked_converted_and_read(mirror, home, monkeypatch):
    import torch

    from dlas_predict.crossdev.sources import help_table

    root, url = mirror
    archs = {"|nor_conv_3x3~0|+|none~0|skip_connect~1|+|none~0|none~1|none~2|": 0,
             "|skip_connect~0|+|none~0|skip_connect~1|+|none~0|none~1|none~2|": 1}
    files = {}
    for path, obj in (("data/nasbench201/str_arch2idx.pt", archs),
                      ("data/nasbench201/latency/box_1.pt", [3.5, 1.25]),
                      ("data/nasbench201/latency/phone_1.pt", [12, 7])):
        tmp = home.parent / "obj.pt"
        torch.save(obj, tmp)
        files[path] = tmp.read_bytes()
    _pin(root, "help", files, monkeypatch)
    r = run_cli("data", "fetch", "help", "--mirror", url, "--json")
    assert r.exit_code == 0, r.output
    folder = Path(json.loads(r.stdout)["help"])
    assert folder == home / "data" / "help_nb201"
    with gzip.open(folder / "latency.csv.gz", "rt") as fh:
        rows = fh.read().splitlines()
    assert rows[0] == "device,arch_index,arch_str,latency"
    assert f"box_1,1,{next(a for a, i in archs.items() if i == 1)},1.25" in rows
    assert any(r.startswith("phone_1,0,") and r.endswith(",12.0") for r in rows)
    # read from DLAS_HOME when the shared folder holds nothing
    table = help_table(None)
    assert set(table.device) == {"box_1", "phone_1"} and len(table) == 4
    # fetched again: every file is kept (its checksum holds), nothing downloaded
    (root / "data").rename(root / "gone")
    assert run_cli("data", "fetch", "help", "--mirror", url).exit_code == 0


@pytest.mark.skipif(not (SHARED_DATA / "tophub").is_dir(), reason="TopHub's logs not there")
def test_tophub_is_fetched_and_its_kernels_read(mirror, home, monkeypatch):
    from dlas_predict.crossdev import sources

    root, url = mirror
    lines = (SHARED_DATA / "tophub" / "arm_cpu.jsonl").read_text().splitlines()[:200]
    _pin(root, "tophub", {"tophub/arm_cpu_v0.08.log": ("\n".join(lines) + "\n").encode()},
         monkeypatch)
    r = run_cli("data", "fetch", "tophub", "--mirror", url)
    assert r.exit_code == 0, r.output
    assert "converted into" in r.output
    got = (home / "data" / "tophub" / "arm_cpu.jsonl").read_text().splitlines()
    assert got == lines
    assert sources.shared_folder("tophub", None) == home / "data" / "tophub"


def test_a_truncated_download_is_removed_and_named(mirror, home, monkeypatch):
    root, url = mirror
    _pin(root, "tophub", {"tophub/arm_cpu_v0.08.log": b'{"a": 1}\n' * 100}, monkeypatch)
    (root / "tophub/arm_cpu_v0.08.log").write_bytes(b'{"a": 1}\n' * 50)  # cut short
    r = run_cli("data", "fetch", "tophub", "--mirror", url)
    assert_clean_error(r, "sha256 does not match the pinned file")
    raw = home / "data" / "upstream" / "tophub" / "tophub"
    assert not any(raw.glob("*")) if raw.is_dir() else True
    assert not (home / "data" / "tophub").exists()


def test_no_network_names_the_url_and_the_way_without_it(home, monkeypatch, tmp_path):
    r = run_cli("data", "fetch", "tophub", "--mirror", "http://127.0.0.1:9/")
    assert_clean_error(r, "cannot download http://127.0.0.1:9/tophub/arm_cpu_v0.08.log")
    assert "--from DIR" in r.output
    # the same files from a folder
    src = tmp_path / "copied"
    _pin(src, "tophub", {"tophub/arm_cpu_v0.08.log": b'{"a": 1}\n'}, monkeypatch)
    r = run_cli("data", "fetch", "tophub", "--from", src)
    assert r.exit_code == 0, r.output
    assert (home / "data" / "tophub" / "arm_cpu.jsonl").read_text() == '{"a": 1}\n'
    import shutil

    shutil.rmtree(home / "data" / "upstream")
    assert_clean_error(run_cli("data", "fetch", "tophub", "--from", tmp_path / "empty"),
                       "not found there")
    assert_clean_error(run_cli("data", "fetch", "imagenet"), "known: help, tophub, all")


def test_a_reader_without_any_public_data_says_how_to_fetch_it(home):
    from dlas_predict.crossdev.sources import help_table

    with pytest.raises(Exception, match="dlas-predict data fetch help"):
        help_table(None)
