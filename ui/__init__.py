"""The Gradio UI of the explainer; `app.py` assembles these modules into `demo`.

One module per part of the page, each with `create_ui()` (builds its components, inside the caller's Blocks context)
and `create_event_handlers()` (wires their events), the split text-generation-webui uses:

- `text_tab`: prompt, optional answer, methods, the answer strip, step and span sliders, heatmaps, downloads,
  opening a saved result, the examples (`examples`: their saved results, shown at once and on the first page view);
  `estimates`: the time estimate line under its methods.
- `faithfulness`: the faithfulness accordion of the text tab.
- `image_tab`: image + question, overlays.
- `contrast`, `layers`, `regions`: the text tab's contrastive step, and both tabs' MACS-by-layer and "which answer
  tokens used this?" accordions (`faithfulness` serves both tabs too).

`api`: the public API ("Use via API"): typed endpoints with named parameters on the tabs' request builders; every
event of the page itself is private.

`admission`: the gate every event that runs a model passes, on the page and in the API (per-visitor limits, a bounded
queue, turns by visitor); `visitors`: who a request's visitor is (the session, or the address behind a trusted proxy).

Shared pieces: `models` (the process's model bundles, loaded on first use, and the lines naming them), `stream`
(following a library stream, the request state kept in `gr.State`, the explain driver both tabs share), `events`
(views turned into `{component: value}` and the one place handlers are put on the GPU), `errors` (the one decorator
that turns the library's typed errors into `gr.Error`), `inputs` (widget values checked), `options` (the method
option widgets and method choices), `downloads` (files served by path), `uploads` (the one gate through which a
handler opens a visitor's file) and `markup` (the one rule for text from outside: escaped before Markdown, HTML or
a toast).

Handlers return a view dataclass (`TextView`, `ImageView`, `FaithfulnessView`) with one field per component; a field
left at `events.KEEP` leaves its component as it is. Per-visitor data lives in `gr.State` as plain CPU objects: the
result shown and the `RequestState` of the newest request.

Imports run one way: `ui` imports gradio, `explainer` and `visuals`; nothing imports `ui` but `app.py` and the tests.
"""
