"""`kvsim SUBCOMMAND [ARGS...]`: one command for every kvsim tool; each subcommand runs exactly what
`python -m MODULE ARGS...` runs (the same flags, output, errors and exit codes; the `python -m` forms stay).

    kvsim predict --hw h100-sxm --model llama-3-8b --prompt 4096 --gen 256
    kvsim sweep --out results/mine          kvsim serve ... --json          kvsim validate
    kvsim calibrate --device cpu --out my-cpu.yaml    kvsim hw list
    kvsim generate --model DIR --policy full --prompt "Once upon a time"
    kvsim capture ...    kvsim quality TRACE_DIR    kvsim timing ...

The model-running subcommands (calibrate, generate, capture, quality, timing) need the `capture` extra
(torch); their modules are imported only when chosen, so `kvsim predict` never imports torch.
"""
from __future__ import annotations

import runpy
import sys

# subcommand -> (module run as `python -m`, one line for the overview)
COMMANDS = {
    "predict": ("sim.predict", "one design point: latency, throughput, memory, operator breakdown"),
    "sweep": ("sim.sweep", "the design-space sweep (grid, cache, plots, summary)"),
    "serve": ("sim.serve", "serving under load: the discrete-event simulator"),
    "validate": ("sim.validate", "predictions against measured runs and published results"),
    "bench": ("sim.bench", "the analytic engine's speed (points/s)"),
    "hw": ("hwmodels", "hardware files: `kvsim hw list`, `kvsim hw show NAME`"),
    "calibrate": ("hwmodels.calibrate", "measure this machine into a hardware file (torch)"),
    "generate": ("keyformer.generate", "run a real model under an evicting policy (torch)"),
    "capture": ("traces.capture", "capture attention/KV traces of real runs (torch)"),
    "quality": ("traces.quality", "quality of a captured trace: ROUGE, agreement, perplexity (torch)"),
    "timing": ("traces.timing", "measured step latencies on this machine (torch)"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: kvsim SUBCOMMAND [ARGS...]   (kvsim SUBCOMMAND --help for its flags)", "", "subcommands:"]
    lines += [f"  {name:<{width}}  {text}   [python -m {module}]" for name, (module, text) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        try:
            print(usage(), file=sys.stdout if argv else sys.stderr)
        except BrokenPipeError:     # `kvsim --help | head`
            pass
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"error: unknown subcommand {name!r}; expected one of {', '.join(COMMANDS)} (see kvsim --help)",
              file=sys.stderr)
        return 2
    module = COMMANDS[name][0]
    saved = sys.argv
    sys.argv = [f"kvsim {name}", *rest]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1
    finally:
        sys.argv = saved
    return 0


if __name__ == "__main__":
    sys.exit(main())
