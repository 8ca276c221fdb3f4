"""The ``ucudnn`` command.  Each subcommand lives in its own module and registers itself.

Exit codes: 0 success, 2 bad input, 3 infeasible limit, 4 GPU / cuDNN unavailable or failing.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from ..errors import CudnnError, CudnnNotFound, GpuUnavailable, InfeasibleError, InputError, UcudnnError

# One line per subcommand module; each defines ``register(subparsers)``.
SUBCOMMANDS = ("plan", "bench", "serve", "plot", "precompute", "bundle")


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = argparse.ArgumentParser(prog="ucudnn", description="Micro-batched cuDNN convolutions: benchmark, plan, execute, serve.")
    parser.add_argument("--version", action="version", version=f"ucudnn {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(f"{__name__}.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except InfeasibleError as e:
        print(f"ucudnn: infeasible: {e}", file=sys.stderr)
        return 3
    except InputError as e:
        print(f"ucudnn: error: {e}", file=sys.stderr)
        return 2
    except (GpuUnavailable, CudnnNotFound, CudnnError) as e:
        print(f"ucudnn: {e}", file=sys.stderr)
        return 4
    except UcudnnError as e:
        print(f"ucudnn: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `ucudnn plan --json | head`: the reader left; not an error
        sys.stderr.close()
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
