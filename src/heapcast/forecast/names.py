"""The names the forecasting commands offer (orders, tasks, vocabularies, models, protocols),
in a module that imports nothing heavy, so that the command line is built without numpy. The
modules that implement them import these tuples from here."""
from __future__ import annotations

ORDERS = ("thread", "process")
TASKS = ("next", "free", "lifetime")
#: How `free` labels group the live blocks (heapcast.forecast.tasks): all of them, or those of
#: the freed block's size class or call site.
FREE_GROUPS = ("all", "class", "site")
VOCAB_NAMES = ("seed64", "article", "rich")
MODEL_NAMES = ("majority", "repeat-last", "ngram", "gru", "lstm", "transformer", "seed")
DEFAULT_MODEL = "gru"
PROTOCOLS = ("article", "time", "cross-run", "cross-program")
SPLITS = ("all", "article", "time")
