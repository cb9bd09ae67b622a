"""The forecasting subcommands of `heapcast`: dataset, train, evaluate.

`add_parsers(subparsers)` adds them to heapcast's argparse subparsers; each handler parses,
calls the library function of the same name and prints.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..trace.base import TraceError
from .names import (DEFAULT_MODEL, FREE_GROUPS, MODEL_NAMES, ORDERS, PROTOCOLS, SPLITS, TASKS,
                    VOCAB_NAMES)


def _cmd_dataset(a) -> int:
    from .._outputs import show_progress
    from .dataset import build_dataset
    out = build_dataset(a.traces, a.output, order=a.order, parquet=not a.no_parquet,
                        progress=show_progress(a.quiet))
    print(f"heapcast: wrote dataset {out}", file=sys.stderr)
    return 0


def _config(a) -> dict:
    """Model settings given on the command line (the rest keep the model's defaults)."""
    cfg = {name: getattr(a, name) for name in ("hidden", "batch", "bptt", "lr", "seed", "threads")
           if getattr(a, name) is not None}
    if a.orders:
        cfg["orders"] = [int(x) for x in a.orders.split(",")]
    if a.no_sites:
        model = a.model or DEFAULT_MODEL
        if model == "ngram":
            cfg["sites"] = False
        elif model in ("gru", "lstm", "transformer"):
            cfg["site_embed"] = 0
        else:
            raise ValueError(f"--no-sites: model {model!r} reads no call sites")
    if a.target:
        cfg["target"] = a.target
    for item in a.set or []:
        key, _, value = item.partition("=")
        cfg[key] = json.loads(value) if value else True
    return cfg


def _cmd_train(a) -> int:
    from .._outputs import prepare_output, show_progress
    from .train import train
    prepare_output(a.output)   # before training, not when the model is saved
    model = a.model or DEFAULT_MODEL
    s = train(a.traces, a.output, model=model, task=a.task, vocab=a.vocab, epochs=a.epochs,
              split=a.split, order=a.order, max_steps=a.max_steps, max_events=a.max_events,
              config=_config(a), progress=show_progress(a.quiet), resume=a.resume,
              device=a.device, validate=a.validate or (), free_group=a.free_group)
    st = s["stats"]
    if s["rank"] != 0:
        return 0  # under torchrun: rank 0 speaks for all
    if a.json:
        print(json.dumps(s, indent=2))
    else:
        print(f"heapcast: trained {s['model']} ({s['task']}, {s['vocab']}, split {s['split']}) on "
              f"{st.get('events', 0):,} events in {s['wall_s']:.1f} s "
              f"{'on %d processes ' % s['world'] if s['world'] > 1 else ''}"
              f"({s['events_per_s_wall']:,.0f} events/s, loading included) -> {s['output']}",
              file=sys.stderr)
    return 0


def _cmd_evaluate(a) -> int:
    from .evaluate import evaluate, format_result
    if not a.traces or not a.protocol:
        raise ValueError("evaluate needs MODEL TRACE... --protocol P")
    r = evaluate(a.model, a.traces, a.protocol, max_samples=a.max_samples)
    print(json.dumps(r, indent=2) if a.json else format_result(r))
    return 0


def add_parsers(sub) -> None:
    """Adds `dataset`, `train` and `evaluate` to heapcast's subcommand parsers."""
    d = sub.add_parser("dataset", help="token streams and features of traces, memory-mapped")
    d.add_argument("traces", nargs="+", type=Path, metavar="TRACE")
    d.add_argument("-o", "--output", type=Path, required=True, help="dataset directory to create")
    d.add_argument("--order", choices=ORDERS, default="thread",
                   help="one stream per thread (default, the article's) or per process (exact "
                        "global order)")
    d.add_argument("--no-parquet", action="store_true", help="skip events.parquet")
    d.add_argument("-q", "--quiet", action="store_true",
                   help="no progress bar (one is drawn only when stderr is a terminal)")
    d.set_defaults(func=_cmd_dataset)

    t = sub.add_parser("train", help="train a forecasting model on traces or datasets")
    t.add_argument("traces", nargs="+", type=Path, metavar="TRACE")
    t.add_argument("-o", "--output", type=Path, required=True, metavar="MODEL",
                   help="model file to write (.safetensors)")
    t.add_argument("--model", choices=list(MODEL_NAMES), default=None,
                   help=f"default: {DEFAULT_MODEL} (the stateful GRU)")
    t.add_argument("--task", choices=TASKS, default="next")
    t.add_argument("--vocab", choices=[v for v in VOCAB_NAMES if v != "article"], default=None,
                   help="token vocabulary (default: seed64 for --model seed, else rich)")
    t.add_argument("--validate", nargs="+", type=Path, metavar="RUN",
                   help="validation recordings (neither trained nor tested on) on which the "
                        "n-gram's orders and call sites and the gru's trust in its hints are "
                        "chosen")
    t.add_argument("--free-group", choices=FREE_GROUPS, default=None,
                   help="--task free: name the freed block by its rank among all live blocks, "
                        "or within its size class or call site (default: chosen on --validate "
                        "runs, else all)")
    t.add_argument("--epochs", type=int, default=1)
    t.add_argument("--split", choices=SPLITS, default="all",
                   help="rows to learn from: all, or all but what --protocol article/time "
                        "holds out")
    t.add_argument("--order", choices=ORDERS, default=None,
                   help="stream order (default: thread for next, process for free/lifetime)")
    t.add_argument("--max-steps", type=int, default=0,
                   help="stop after N optimizer steps (as if interrupted: --resume continues)")
    t.add_argument("--max-events", type=int, default=0,
                   help="learn from about N of the training rows only (blocks spread over them)")
    t.add_argument("--target", choices=("article", "true"), default=None,
                   help="seed: train on the article's buggy labels (default) or the true classes")
    t.add_argument("--orders", help="ngram: comma-separated context orders")
    t.add_argument("--no-sites", action="store_true", help="do not use call sites as inputs")
    t.add_argument("--hidden", type=int, help="recurrent units")
    t.add_argument("--batch", type=int, help="parallel stream segments (seed: samples per batch)")
    t.add_argument("--bptt", type=int, help="truncated backpropagation length")
    t.add_argument("--lr", type=float, help="learning rate")
    t.add_argument("--seed", type=int, help="random seed")
    t.add_argument("--threads", type=int,
                   help="CPU threads (default 2): each training step's segments are split "
                        "between them, one torch thread each; the same --threads gives the "
                        "same bytes")
    t.add_argument("--set", action="append", metavar="KEY=JSON",
                   help="any other model setting, e.g. --set warmup=512")
    t.add_argument("--device", default="cpu", help="torch device (cpu, cuda, cuda:1)")
    t.add_argument("--resume", action="store_true", help="continue from MODEL.ckpt")
    t.add_argument("--json", action="store_true", help="print the training summary as JSON")
    t.add_argument("-q", "--quiet", action="store_true",
                   help="no progress bar (one is drawn only when stderr is a terminal)")
    t.set_defaults(func=_cmd_train)

    e = sub.add_parser("evaluate", help="score a model on traces under a protocol")
    e.add_argument("model", type=Path, metavar="MODEL")
    e.add_argument("traces", nargs="*", type=Path, metavar="TRACE")
    e.add_argument("--protocol", choices=PROTOCOLS)
    e.add_argument("--max-samples", type=int, default=0,
                   help="score a fixed random subset of N rows (for slow models)")
    e.add_argument("--json", action="store_true", help="print one JSON object")
    e.set_defaults(func=_cmd_evaluate)


def main(argv=None) -> int:
    """Runs one forecasting subcommand (the same as `heapcast dataset|train|evaluate ...`)."""
    p = argparse.ArgumentParser(prog="heapcast")
    add_parsers(p.add_subparsers(dest="verb", required=True))
    a = p.parse_args(argv)
    try:
        return a.func(a)
    except BrokenPipeError:
        return 0
    except (TraceError, ValueError, OSError) as e:     # ModelError is a ValueError
        print(f"heapcast {a.verb}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
