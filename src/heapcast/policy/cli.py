"""The policy subcommands of `heapcast`: `compile`, and `evaluate` of a compiled POLICY.

`add_parsers(subparsers)` adds `compile` and makes `evaluate` accept a POLICY as well as a model
file (it must run after heapcast.forecast.cli.add_parsers, which defines `evaluate`).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from .names import COMPILE_KINDS, DEFAULT_CTX


def _cmd_compile(a) -> int:
    from .._outputs import prepare_output
    prepare_output(a.output)
    if a.onnx:
        from .onnx_export import export_onnx
        out = export_onnx(a.model, a.output)
        print(f"heapcast: exported the network's step to {out} (ONNX)", file=sys.stderr)
        return 0
    from .compile import compile_policy
    spec = compile_policy(a.model, a.output, kind=a.kind, int8=a.int8, prune=a.prune,
                          data=a.data, ctx=_lengths(a.ctx), max_rows=a.max_rows,
                          min_count=a.min_count, placement=a.placement, align=a.align)
    if a.json:
        print(json.dumps(spec, indent=2, default=str))
    else:
        what = spec.get("table") or spec.get("rnn")
        print(f"heapcast: compiled {spec['model']['kind']} ({spec['task']}, {spec['vocab']}) into "
              f"a {spec['kind']} policy {a.output} ({spec['bytes']:,} bytes; {what})",
              file=sys.stderr)
        if "placement" in spec:
            from .placement import describe
            print(f"heapcast: placement: {describe(spec['placement'])}", file=sys.stderr)
        elif spec["task"] == "lifetime" and spec["kind"] == "rnn":
            print("heapcast: note: `heapcast run` cannot place blocks with an rnn policy (its "
                  "predictions need the whole event stream); `--kind table` compiles one it can",
                  file=sys.stderr)
    return 0


def _lengths(text: str) -> list:
    try:
        return [int(k) for k in text.split(",") if k.strip()]
    except ValueError:
        raise ValueError(f"--ctx {text!r}: expected comma-separated numbers of tokens") from None


def add_parsers(sub) -> None:
    """Adds `compile` and extends `evaluate` to compiled policies."""
    c = sub.add_parser("compile", help="compile a trained model into a native POLICY (or ONNX)")
    c.add_argument("model", type=Path, metavar="MODEL")
    c.add_argument("-o", "--output", type=Path, required=True, metavar="POLICY")
    c.add_argument("--kind", choices=COMPILE_KINDS, default="rnn",
                   help="rnn: the network itself (default GRU only); table: a distilled lookup "
                        "(any model)")
    c.add_argument("--int8", action="store_true", help="rnn: int8 weights")
    c.add_argument("--prune", type=float, default=0.0, metavar="F",
                   help="rnn: drop the fraction F of hidden units that carry the least weight")
    c.add_argument("--data", type=Path, nargs="+", metavar="TRACE",
                   help="table: traces to distil on (default: the model's training traces)")
    c.add_argument("--ctx", default=",".join(map(str, DEFAULT_CTX)), metavar="K1,K2,...",
                   help="table: context lengths in tokens of the most specific keys, backed off "
                        "longest first (default %(default)s; 0: none)")
    c.add_argument("--min-count", type=int, default=2, metavar="N",
                   help="table: keep a context key only if it was seen N times or more in the "
                        "distilled rows (default 2; 1 keeps every context: tables 1.8-3.5x "
                        "larger, 0.2-0.4 points of top-1 better on jq and sqlite3)")
    c.add_argument("--max-rows", type=int, default=2_000_000,
                   help="table: distil on at most N rows (default 2,000,000)")
    c.add_argument("--placement", choices=("lab", "lifetime", "one", "glibc"), default="lab",
                   help="lifetime table: how `heapcast run` places blocks: by lifetime class, in "
                        "one group, or on glibc's malloc; lab (default): what the allocator lab "
                        "finds best on the same traces (docs/allocator.md)")
    c.add_argument("--align", type=int, choices=(16, 8), default=16,
                   help="lifetime table: the alignment `heapcast run` gives blocks with this "
                        "policy, and that the lab judges the placement at: 16, glibc's "
                        "guarantee (default), or 8, size classes every 8 bytes as mimalloc's "
                        "(heapcast run --align 8)")
    c.add_argument("--onnx", action="store_true",
                   help="export the network's step as ONNX instead (-o model.onnx)")
    c.add_argument("--json", action="store_true", help="print the policy's spec as JSON")
    c.set_defaults(func=_cmd_compile)

    t = sub.choices["train"]
    forecast_train = t.get_default("func")
    t.add_argument("--from-log", action="store_true",
                   help="fine-tune --init MODEL on feature logs (TRACE: directories or .features "
                        "files written by heapcast record --policy POLICY --log-features)")
    t.add_argument("--init", type=Path, metavar="MODEL", help="with --from-log: the model to "
                   "continue training")

    def _cmd_train(a) -> int:
        if not a.from_log:
            if a.init:
                raise ValueError("--init goes with --from-log")
            return forecast_train(a)
        if not a.init:
            raise ValueError("--from-log needs --init MODEL, the model to continue training")
        from .._outputs import prepare_output, show_progress
        from .finetune import finetune
        prepare_output(a.output)
        s = finetune(a.init, a.traces, a.output, epochs=a.epochs, lr=a.lr,
                     progress=show_progress(a.quiet))
        print(f"heapcast: fine-tuned {a.init} on {s['rows']:,} logged decisions in "
              f"{s['wall_s']:.1f} s -> {s['output']}", file=sys.stderr)
        return 0

    t.set_defaults(func=_cmd_train)

    e = sub.choices["evaluate"]
    forecast_evaluate = e.get_default("func")
    e.add_argument("--online", action="store_true",
                   help="score the predictions a policy logged while `heapcast record --policy` "
                        "ran: heapcast evaluate --online TRACE")
    e.usage = ("heapcast evaluate MODEL|POLICY TRACE... --protocol P [--json]\n"
               "       heapcast evaluate --online TRACE [--json]")

    def _cmd_evaluate(a) -> int:
        from .fileformat import is_policy
        if a.online:
            if a.traces or a.protocol:
                raise ValueError("--online takes one TRACE and no --protocol: heapcast evaluate "
                                 "--online TRACE")
            from .online import evaluate_online
            r = evaluate_online(a.model)
        elif not a.traces or not a.protocol or not is_policy(a.model):
            return forecast_evaluate(a)      # a model (it says what a command line lacks)
        else:
            from .evaluate import evaluate_policy
            r = evaluate_policy(a.model, a.traces, a.protocol)
        from ..forecast.evaluate import format_result
        print(json.dumps(r, indent=2) if a.json else format_result(r))
        return 0

    e.set_defaults(func=_cmd_evaluate)
