"""Weight stashing: accuracy per epoch of the weight policies on the digits CNN (:mod:`.stashing`)."""
