"""Every public tool is visible to dir(tt), help(tt) and tab completion, the lazily loaded ones included."""
import pydoc

import torchtrace as tt


def test_dir_lists_every_public_name_including_the_lazily_loaded_tools():
    listed = dir(tt)
    assert set(tt.__all__) <= set(listed)
    for lazy in ("draw", "show", "trace", "compile", "flow", "detect_anomaly", "recording"):
        assert lazy in listed


def test_help_documents_the_lazily_loaded_tools():
    text = pydoc.render_doc(tt, renderer=pydoc.plaintext)
    for tool in ("draw(", "show(", "jvp(", "jacobian("):
        assert tool in text


def test_the_readable_switch_is_public():
    assert "readable" in tt.__all__ and callable(tt.readable)
