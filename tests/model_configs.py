"""Model configurations the tests train with: small enough to train in seconds on 2 cores."""

#: The default GRU (n-gram hints, in-run memory), tiny.
TINY = {"hidden": 32, "batch": 8, "bptt": 32, "lr": 0.01, "threads": 1, "embed": 16,
        "site_embed": 8, "site_buckets": 64, "warmup": 32}
