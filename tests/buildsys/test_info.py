"""`python -m transformer_engine info` / te-info: one line per fact, the real reason, --help."""
import pytest

from transformer_engine import __main__ as te_main
from transformer_engine.common import native


def test_info_has_one_line_per_fact(capsys):
    assert te_main.main(["info"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    keys = [line.split(":")[0] for line in lines[1:]]
    assert len(keys) == len(set(keys)), lines
    assert any(line.startswith("native module: ") for line in lines)
    why = native.native_unavailable_reason()
    if why:  # the reason is given once, on the native module's line
        assert sum(why in line for line in lines) == 1, lines


def test_help_and_bad_command(capsys):
    with pytest.raises(SystemExit) as exc:
        te_main.main(["--help"])
    assert exc.value.code == 0 and "Reports how transformer_engine was built" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        te_main.main(["bogus"])
    assert exc.value.code == 2


def test_reason_is_the_real_import_error(monkeypatch):
    monkeypatch.setattr(native, "build_summary", lambda: {"backend": "cuda", "reason": "r"})
    why = native._why_not_native(ImportError("libcublasLt.so.13: cannot open shared object file"))
    assert why == "the native module failed to import: libcublasLt.so.13: cannot open shared object file"
    monkeypatch.setattr(native, "build_summary", lambda: {"backend": "none", "reason": "NVTE_BACKEND=none"})
    assert "NVTE_BACKEND=none" in native._why_not_native(ImportError("x"))
