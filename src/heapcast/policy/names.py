"""What `heapcast compile` offers, in a module that imports nothing heavy (the command line is
built without numpy); heapcast.policy.compile implements it."""
from __future__ import annotations

#: Policy kinds (docs/policy-format.md), as `cfg[kind]` numbers them.
KINDS = {"table": 1, "rnn": 2}
COMPILE_KINDS = tuple(KINDS)
#: A table's context lengths, in tokens, longest first.
DEFAULT_CTX = (32, 16, 4)
