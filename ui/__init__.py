"""The Gradio UI of the explainer; `app.py` assembles these modules into `demo`.

One module per part of the page, each with `create_ui()` (builds its components, inside the caller's Blocks context)
and `create_event_handlers()` (wires their events), the split text-generation-webui uses. The folders name the roles:

- `tabs/`: the two tabs (`text_tab`, `image_tab`), the examples and their saved results, and the text tab's first
  view and share links (`share`).
- `panels/`: the accordions and lines inside a tab: `contrast`, `layers`, `regions`, `sources`, `reliance`,
  `faithfulness` (with `measurement`, its widgets read into one request) and `estimates`.
- `guards/`: what every public event passes through: widget values checked (`inputs`), text from outside escaped
  (`markup`), visitors' files opened through one gate (`uploads`), typed errors turned into `gr.Error` (`errors`),
  and the admission gate of every event that runs a model (`admission`: per-visitor limits, a bounded queue, turns by
  visitor; `visitors`: who a request's visitor is, the session or the address behind a trusted proxy).
- at the top, the plumbing both tabs share: `api` (the public "Use via API" endpoints on the tabs' request builders;
  every event of the page itself is private), `models` (the process's model bundles), `stream` (the explain driver
  and the request state kept in `gr.State`), `events` (views turned into `{component: value}`, the one place handlers
  are put on the GPU), `requests` (each tab's `ExplainRequest`), `gpu_time` (ZeroGPU durations), `options`,
  `page`, `downloads` and `process`.

Handlers return a view dataclass (`TextView`, `ImageView`, `FaithfulnessView`) with one field per component; a field
left at `events.KEEP` leaves its component as it is. Per-visitor data lives in `gr.State` as plain CPU objects: the
result shown and the `RequestState` of the newest request.

Imports run one way: `ui` imports gradio, `explainer` and `visuals`; nothing imports `ui` but `app.py` and the tests.
Panels may import a tab (`contrast` draws the text tab's views); no module reaches into another's private names.
"""
