"""Pictures: desirable sets (Fig. 8) and workspace division (Fig. 13) render to PNG and SVG."""
from __future__ import annotations

import pytest
import synthetic

from ucudnn.errors import InputError
from ucudnn.planning.pareto import desirable_set
from ucudnn.planning.wd import compare_policies

pytest.importorskip("matplotlib")

from ucudnn.planning.plots import plot_desirable, plot_division

MiB = synthetic.MiB


@pytest.fixture
def table():
    return synthetic.table(n_kernels=4, batch=32, policy="powerOfTwo", repeats=2)


def test_a_desirable_set_renders_as_png_and_svg(table, tmp_path):
    configs = desirable_set(table.kernels[0], "powerOfTwo")
    png = plot_desirable(configs, tmp_path / "d.png", chosen=configs[0], limit=4 * MiB, title="conv0")
    svg = plot_desirable(configs, tmp_path / "d.svg", chosen=configs[-1])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"<svg" in svg.read_bytes()


def test_the_division_of_wd_wr_and_undivided_renders(table, tmp_path):
    plans = compare_policies(table, "powerOfTwo", total_workspace=32 * MiB)["plans"]
    out = plot_division(plans, tmp_path / "v.svg", title="division")
    assert b"<svg" in out.read_bytes()


def test_an_unknown_picture_format_is_refused_by_field(table, tmp_path):
    with pytest.raises(InputError, match="out"):
        plot_desirable(desirable_set(table.kernels[0], "powerOfTwo"), tmp_path / "d.bmp")
    with pytest.raises(InputError, match="kernel"):
        plot_desirable([], tmp_path / "d.png")


def test_the_plot_commands_write_the_pictures(table, tmp_path, capsys):
    from ucudnn.cli import main

    t = tmp_path / "T.json"
    table.save(t)
    assert main(["plot", "desirable", "--from-table", str(t), "--kernel", "conv1/forward", "--batch-policy",
                 "powerOfTwo", "--total-workspace", "16MiB", "-o", str(tmp_path / "d.png")]) == 0
    assert main(["plot", "division", "--from-table", str(t), "--batch-policy", "powerOfTwo", "--total-workspace",
                 "16MiB", "--workspace-limit", "1MiB", "-o", str(tmp_path / "v.png")]) == 0
    assert (tmp_path / "d.png").stat().st_size > 0 and (tmp_path / "v.png").stat().st_size > 0
    assert main(["plot", "desirable", "--from-table", str(t), "--kernel", "nope/forward", "-o",
                 str(tmp_path / "x.png")]) == 2
    assert "nope/forward" in capsys.readouterr().err
