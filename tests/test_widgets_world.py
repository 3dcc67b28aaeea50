"""Chapter 3's world explorer: its frames, sharing one unroll per setting, are world_view's own."""

from __future__ import annotations

import pytest

from precisionlab import widgets
from precisionlab.widgets import figure_json


@pytest.mark.parametrize("policy", ["hysteresis", "per_instance"])
def test_explorer_frames_are_the_uncached_views(policy):
    explorer = widgets.world_explorer(tol=1e-3, policy=policy, horizon=120)
    assert explorer.title == "world_view"
    for horizon in (120, 20, 70, 10, 20):  # the first call fills the cache for every horizon
        panel, fig = explorer.view(tol=1e-3, policy=policy, horizon=horizon)
        want_panel, want_fig = widgets.world_view(tol=1e-3, policy=policy, horizon=horizon)
        assert panel.text == want_panel.text
        assert figure_json.figure_spec(fig) == figure_json.figure_spec(want_fig)


def test_explorer_outside_the_grid_and_bad_horizons():
    view = widgets.world_explorer().view
    assert view(horizon=15)[0].text == widgets.world_view(horizon=15)[0].text
    with pytest.raises(ValueError, match="horizon"):
        view(horizon=0)
    with pytest.raises(TypeError):
        view(horizons=10)
