"""Shared by benchmark scripts: the provenance block and writing JSON + Markdown under a results folder."""
from __future__ import annotations

import datetime as _dt
import json
import platform
import sys
from pathlib import Path
from typing import Any


def provenance() -> dict[str, Any]:
    info: dict[str, Any] = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                            "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
                            "python": platform.python_version(), "host": platform.node()}
    try:
        import cupy as cp

        from ucudnn.binding import cudnn
        from ucudnn.binding.gpu import device_name

        info.update(device=device_name(), cudnn_version=cudnn.get_version(), cudnn_library=cudnn.library_path(),
                    cupy=cp.__version__)
    except Exception as e:  # noqa: BLE001 - CPU-only benchmarks
        info.update(device=f"cpu ({platform.processor() or platform.machine()})", gpu=str(e))
    try:
        import torch

        info["torch"] = torch.__version__
    except Exception:  # noqa: BLE001
        pass
    return info


def write(out_dir: str | Path, name: str, doc: dict[str, Any], markdown: str) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n")
    (out / f"{name}.md").write_text(markdown.rstrip() + "\n")
    print(markdown)


def md_header(title: str, prov: dict[str, Any]) -> str:
    keys = ("device", "cudnn_version", "cupy", "torch", "date", "command")
    return f"# {title}\n\n" + "\n".join(f"- {k}: `{prov[k]}`" for k in keys if k in prov) + "\n"
