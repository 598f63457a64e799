"""The sweep's objective figure, read back from the matplotlib object (no screenshot): a full title
inside the figure, the objective's name and direction on the y axis, integer ticks for integer
parameters and a log axis for a parameter swept over orders of magnitude."""

from __future__ import annotations

import pytest

from pgmflow.core.sweep import JobRow, objective_figure

NAME = "test NLPD (mean negative log predictive density of the held-out rows, original units; lower is better)"


def _rows():
    rows, job = [], 0
    for seed in (0, 1, 2, 3, 4):
        for lr in (0.001, 0.1, 10.0):
            rows.append(
                JobRow(
                    job=job,
                    overrides=[f"seed={seed}", f"svi.rate={lr}"],
                    status="FINISHED",
                    run_id=f"r{job}",
                    objective=1.0 + 0.1 * seed + lr,
                )
            )
            job += 1
    return rows


@pytest.fixture
def fig():
    import matplotlib.pyplot as plt

    f = objective_figure(_rows(), NAME, "minimize")
    f.canvas.draw()
    yield f
    plt.close(f)


def test_the_title_is_whole_and_inside_the_figure(fig):
    title = fig._suptitle
    assert " ".join(title.get_text().split()) == f"sweep: {NAME} against each swept parameter"
    box = title.get_window_extent(fig.canvas.get_renderer())
    fig_box = fig.bbox
    assert box.x0 >= fig_box.x0 and box.x1 <= fig_box.x1 and box.y1 <= fig_box.y1, (box, fig_box)


def test_the_y_axis_names_the_objective_and_its_direction(fig):
    for ax in fig.axes:
        label = " ".join(ax.get_ylabel().split())
        assert label == f"objective: {NAME} (minimize)"


def test_integer_parameters_get_integer_ticks_and_wide_ones_a_log_axis(fig):
    by_name = {ax.get_xlabel(): ax for ax in fig.axes}
    assert set(by_name) == {"seed", "svi.rate"}
    seed = by_name["seed"]
    ticks = [t for t in seed.get_xticks() if seed.get_xlim()[0] <= t <= seed.get_xlim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks
    labels = [t.get_text() for t in seed.get_xticklabels() if t.get_text()]
    assert labels and all("." not in lab.replace("\u2212", "-") for lab in labels), labels
    assert seed.get_xscale() == "linear"
    assert by_name["svi.rate"].get_xscale() == "log"


def test_without_a_name_the_axis_says_objective():
    import matplotlib.pyplot as plt

    f = objective_figure(_rows())
    try:
        assert all(ax.get_ylabel() == "objective" for ax in f.axes)
        assert f._suptitle.get_text() == "sweep: objective against each swept parameter"
    finally:
        plt.close(f)
