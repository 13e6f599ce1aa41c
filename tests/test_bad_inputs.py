"""Every op gets a corpus of bad inputs: each must raise the documented exception type with a
message naming the argument. Cases run in-process, so a crash fails the whole run."""
import importlib
import pkgutil

import pytest

import bad_inputs


def _cases():
    for mod in pkgutil.iter_modules(bad_inputs.__path__):
        for case in importlib.import_module(f"bad_inputs.{mod.name}").CASES:
            yield pytest.param(*case[1:], id=f"{mod.name}:{case[0]}")


@pytest.mark.parametrize("thunk,exc,needle", list(_cases()))
def test_bad_input(thunk, exc, needle):
    with pytest.raises(exc) as info:
        thunk()
    assert needle in str(info.value), f"message does not name {needle!r}: {info.value}"


def test_corpus_covers_every_op():
    import llmkern

    covered = set()
    for mod in pkgutil.iter_modules(bad_inputs.__path__):
        covered |= set(importlib.import_module(f"bad_inputs.{mod.name}").OPS)
    missing = [op for op in llmkern.ops.__all__ if op not in covered]
    assert not missing, f"ops without bad-input cases: {missing}"
