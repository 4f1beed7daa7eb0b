"""The version rule: the release part is the NVIDIA TE API level implemented, the local label
marks this implementation; one source of truth read by the packaging metadata."""
import pathlib
import re

import pytest

import transformer_engine

packaging_version = pytest.importorskip("packaging.version", reason="packaging is not installed")
Version = packaging_version.Version

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_version_is_pep440_with_local_label():
    v = Version(transformer_engine.__version__)
    assert v.local == "portable"
    assert v.release[0] == 2  # the NV TE 2.x API


def test_pytorch_frontend_reports_the_same_version():
    te = pytest.importorskip("transformer_engine.pytorch", reason="torch is not installed")
    assert te.__version__ == transformer_engine.__version__


def test_pyproject_reads_the_version_from_the_package():
    text = (ROOT / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in text
    assert re.search(r'version = \{attr = "transformer_engine.__version__"\}', text)
    assert not re.search(r'^version\s*=\s*"', text, re.M)  # no second, static copy


def test_client_version_gates():
    v = Version(transformer_engine.__version__)
    assert v >= Version("0.11.0")      # Lightning's requirement
    assert v >= Version("2.3.0")       # Megatron-Core: delay_wgrad_compute, rope module path
    # Megatron-Core's 2.6.0.dev0 / 2.6.0 gates: save_original_input set on Linear and GroupedLinear
    # after construction (test_save_original_input.py checks that it takes effect)
    assert v >= Version("2.6.0.dev0") and v >= Version("2.6.0")
    te = pytest.importorskip("transformer_engine.pytorch", reason="torch is not installed")
    assert hasattr(te.Linear(16, 16, device="cpu"), "save_original_input")
    assert hasattr(te.GroupedLinear(2, 16, 16, device="cpu"), "save_original_input")
    # Megatron-Core gates at 2.7.0.dev (the router module), which this library does not offer:
    # that path must not be taken
    assert v < Version("2.7.0.dev0")


def test_installed_distribution_matches(installed_metadata):
    import importlib.metadata
    assert importlib.metadata.version("transformer_engine") == transformer_engine.__version__
