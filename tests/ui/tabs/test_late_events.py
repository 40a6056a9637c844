"""An event chained after a request that still carries the step the page showed before the next request shrank the
step slider, served and called through Gradio's queue as the page calls it. The browser test of Cancel
(`test_cancel_stops_a_running_request_frees_the_model_and_the_slider`) met it under load: Cancel, `after_explain`
opened the partial answer on step 3, and the next request's first update (1 token: maximum 2) reached Gradio's copy
of the slider before the views and the PNG chained to `after_explain` were sent with step 3."""

from __future__ import annotations

import pytest

from ..served import serve_app


@pytest.fixture(scope="module")
def server():
    with serve_app() as served:
        yield served


def _call(server, api_name: str, session: str, **values) -> dict:
    """One event of a visitor's session, its inputs the page's values but `values` ({"p<i>": the i-th input's}); its
    final message."""
    index, fn = next((i, f) for i, f in server.demo.fns.items() if f.api_name == api_name)
    data = server.defaults(fn)
    for position, value in values.items():
        data[int(position[1:])] = value
    return server.call(index, data, session)[-1]


@pytest.mark.parametrize("follower", ["export_view_after_explain", "render_after_explain"])
def test_a_late_follower_of_a_request_is_not_refused_when_the_next_request_shrank_the_slider(server, fake, follower):
    session = "late-step"
    done = _call(server, "page_explain", session, p0="Where is Paris", p2=4)  # four tokens: the slider's max is 4
    assert done["success"], done
    shrunk = _call(server, "page_explain", session, p0="Where is Paris", p2=1)  # the next request: one token
    assert shrunk["success"], shrunk
    late = _call(server, follower, session, p2=3)  # inputs: result, methods, step, ...
    assert late["success"], late["output"].get("error")
