"""Plans and planner profiles: what the model is asked, and what counts as its answer.

- :mod:`~robot_latency.plan.actions`: the bundled planner's action language (tokens, parser, GBNF,
  the expanded JSON plan); its vocabulary is :mod:`~robot_latency.plan.vocabulary`, its JSON
  Schema and GBNF grammar :mod:`~robot_latency.plan.action_schema`.
- :mod:`~robot_latency.plan.normalize`: normalization of the operator's text.
- :mod:`~robot_latency.plan.chat`: chat formats (llama.cpp's built-in named templates, no Jinja).
- :mod:`~robot_latency.plan.contract`: output contracts (action tokens, or JSON under a schema).
- :mod:`~robot_latency.plan.profile`: the planner profile, one YAML file per planner, and the
  prompt it builds (a fixed, cacheable prefix and the per-cycle part); the profile file's
  sections, checks and loading are :mod:`~robot_latency.plan.profile_file`.

Pure Python and numpy-free; the chat templates and the JSON-Schema-to-GBNF conversion use
llama-cpp-python's bindings, imported where used.
"""
