"""speculators functions that more than one patch wraps, with their accepted fingerprints.

A fingerprint belongs to the upstream function, not to the patch that wraps it; every patch
wrapping one of these takes its module, name and fingerprints from here.
"""

from __future__ import annotations

EAGLE3_MODULE, EAGLE3_INIT = "speculators.models.eagle3.core", "Eagle3DraftModel.__init__"
# 0.5.0-0.6.0.2, 0.7.0-0.7.0.2, 0.8.0-0.9.0
EAGLE3_INIT_PRINTS = ("f04b7fda88c97a1f", "83dd6d7bc95aca0b", "11fa8fdfc41ebb1b")

DFLASH_MODULE, DFLASH_INIT = "speculators.models.dflash.core", "DFlashDraftModel.__init__"
# 0.6.0-0.6.0.2, 0.7.0-0.7.0.2, 0.8.0-0.8.1, 0.9.0 (0.5.0's DFlash has no verifier head or norm)
DFLASH_INIT_PRINTS = (
    "a6a28a7426c2a323",
    "48fb35b7eadc61a2",
    "2f95f1d9670f24c2",
    "dc3bb0291d808ebb",
)
