"""The opset tests export at where the opset is not what they test.

:data:`TEST_OPSET` is the library's default (18), or the installed torch's TorchScript cap where
that is lower (torch 2.2: 17; ``versions.torchscript_opset``), so that the same test runs on the
TorchScript-only legs of noxfile.py. Tests that ask for a given opset (a range check, attention
promotion's floor of 18) name it themselves, and skip where the torch cannot give it
(``tests/helpers/release_skips.NEEDS_OPSET_18``).
"""

from __future__ import annotations

from hyperexport.base import versions
from hyperexport.library.defaults import DEFAULT_OPSET

TEST_OPSET = versions.torchscript_opset(DEFAULT_OPSET)
