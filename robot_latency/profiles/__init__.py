"""Planner profiles: what the model is asked, and what counts as its answer.

"Profile" in this project means a planner profile only; a model's GGUF facts are
:class:`~robot_latency.floor.modelfacts.ModelFacts`, a device's datasheet is
:class:`~robot_latency.floor.devices.DeviceSheet`.

- :mod:`~robot_latency.profiles.actions`: the bundled planner's action language (tokens, parser,
  GBNF, the expanded JSON plan); its vocabulary is :mod:`~robot_latency.profiles.vocabulary`,
  its JSON Schema and GBNF grammar :mod:`~robot_latency.profiles.action_schema`.
- :mod:`~robot_latency.profiles.normalize`: normalization of the operator's text.
- :mod:`~robot_latency.profiles.chat`: chat formats (llama.cpp's built-in named templates, no
  Jinja).
- :mod:`~robot_latency.profiles.contract`: output contracts (action tokens, or JSON under a schema).
- :mod:`~robot_latency.profiles.profile`: the planner profile, one YAML file per planner, and the
  prompt it builds (a fixed, cacheable prefix and the per-cycle part); the profile file's
  sections, checks and loading are :mod:`~robot_latency.profiles.profile_file`.

Pure Python and numpy-free; the chat templates and the JSON-Schema-to-GBNF conversion use
llama-cpp-python's bindings, imported where used.
"""
