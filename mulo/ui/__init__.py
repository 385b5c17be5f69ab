"""The demo's logic behind its layout, one module per job.

Layering: ``app.py`` (the layout) -> ``mulo.ui`` -> ``mulo.engine`` (and ``mulo.ui.views``, ``mulo.ui.viz``).
Inside ``mulo.ui`` each module imports only those listed before it:

- ``engines``: the shared engine of each family, loaded once (``engine_for``, ``loaded``).
- ``files``: the pictures and exports we send (a swept temp folder) and the bundled example traces.
- ``knobs``: the Advanced panel built from the knob table (``mulo.config.knob_table``), each family's
  values and ranges, the third column's choices and which knobs each method of a request reads.
- ``text``: the Markdown: explainer, metrics legend, a run's numbers, a round's line, a token's
  history, a replay's summary.
- ``handlers``: the gradio handlers (``generate``, the GPU function ``run_methods``, the round
  views, exports and ``load_trace``).

Import the module you need (``from mulo.ui import handlers``); nothing is re-exported here.
"""
