"""Host microseconds per converted convolution call, against nn.Conv2d's own (issue 15's host path).

Why: a training step of small kernels is host-bound, and there the host work per call decides the step time;
whole-step timings on the GPU machines' hosts move 10-25% between runs (``torch_train_compiled_h200.md``).  Here
one small layer (GPU work of a few microseconds) is called in a loop without synchronising, so the loop's wall
time per call is host time, and the implementations are compared in one process, interleaved, medians of
``--rounds`` rounds:

* ``torch``: plain ``nn.Conv2d``;
* ``compiled``: ``ucudnn.torch.convert``'s layer on the compiled launch path (``csrc/launch.cpp``);
* ``compiled-op``: the compiled operator called directly with the layer's entry (the module's Python glue left out:
  the difference to ``compiled`` is that glue);
* ``python``: the converted layer on the Python launch path.

Each for forward only (``no_grad``) and forward + backward (dx and dw), FP32 NCHW and AMP fp16 channels_last.

    python benchmarks/torch_call_overhead.py --out results/torch_call_overhead.json
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _report import md_header, provenance, write  # noqa: E402


def measure(rounds: int, calls: int) -> dict:
    import torch

    import ucudnn.torch as ut
    from ucudnn.torch import fastpath

    assert fastpath.start(wait=True), f"compiled launch path not available ({fastpath.state()})"
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    out: dict = {}
    for mode in ("fp32", "amp"):
        fmt = torch.channels_last if mode == "amp" else torch.contiguous_format
        torch.manual_seed(0)
        plain = torch.nn.Conv2d(16, 16, 3, padding=1, bias=False).cuda().to(memory_format=fmt)
        conv = ut.convert(copy.deepcopy(plain), workspace_limit="256MiB")
        x = torch.randn(2, 16, 8, 8, device="cuda").to(memory_format=fmt).requires_grad_()

        def amp():
            return torch.autocast("cuda", dtype=torch.float16, enabled=mode == "amp")

        with amp():
            conv(x).sum().backward()        # prepares the compiled entry (may benchmark)
        entry = next(v for k, v in conv._ucudnn_layers.items() if isinstance(k, tuple) and k[:1] == (fastpath._FAST,)
                     and k[-2])             # the entry made with gradients wanted
        op = torch.ops.ucudnn_c.conv2d.default._op
        cast = torch.float16 if mode == "amp" else None

        def python_path(m):
            def call(t):
                ready = fastpath.ready
                fastpath.ready = lambda: False
                try:
                    return m(t)
                finally:
                    fastpath.ready = ready
            return call

        impls = {"torch": plain, "compiled": conv,
                 "compiled-op": lambda t: op(t, conv.weight, None, entry[1], cast),
                 "python": python_path(conv)}
        for what in ("forward", "forward+backward"):
            samples: dict = {name: [] for name in impls}
            for _ in range(rounds):
                for name, fn in impls.items():
                    with amp():
                        def once():
                            if what == "forward":
                                with torch.no_grad():
                                    fn(x)
                            else:
                                fn(x).sum().backward()
                        for _ in range(20):
                            once()
                        torch.cuda.synchronize()
                        t0 = time.perf_counter()
                        for _ in range(calls):
                            once()
                        host = (time.perf_counter() - t0) / calls * 1e6
                        torch.cuda.synchronize()
                    samples[name].append(host)
            out[f"{mode} {what}"] = {name: round(statistics.median(v), 2) for name, v in samples.items()}
            # the fastest round too: a host's noise only adds time, so the minimum is the steadier estimate
            out[f"{mode} {what}, fastest round"] = {name: round(min(v), 2) for name, v in samples.items()}
        # which ops of this layer the compiled path launches itself (the others go back to Python)
        before = list(torch.ops.ucudnn_c.stats())
        with amp():
            conv(x).sum().backward()
        after = list(torch.ops.ucudnn_c.stats())
        d = [b - a for a, b in zip(before, after)]
        out[f"{mode} launches"] = {"compiled": d[:3], "python": d[3:]}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "torch_call_overhead.json")
    a = ap.parse_args(argv)
    rows = measure(a.rounds, a.calls)
    prov = provenance()
    doc = {"provenance": prov, "host_us_per_call": rows}
    names = list(rows["fp32 forward"])
    md = [md_header("Host microseconds per convolution call: nn.Conv2d vs ucudnn.torch (issue 15)", prov),
          "One 16 -> 16 3x3 layer on a 2 x 16 x 8 x 8 input (GPU work of microseconds), called in a loop without "
          "synchronising: wall time per call = host time.  Medians of the rounds (and the fastest round), "
          "implementations interleaved.", "",
          "| mode, call | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for key, v in rows.items():
        if "launches" in key:
            md.append(f"| {key} (fwd, dx, dw) | compiled {v['compiled']}, to Python {v['python']} |"
                      + " |" * (len(names) - 1))
            continue
        md.append(f"| {key} | " + " | ".join(f"{v[n]:.1f}" for n in names) + " |")
    write(a.out.parent, a.out.stem, doc, "\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
