"""robot_latency: an edge-robot control-loop latency testbed for language-model planners."""

from robot_latency.llama_backends import load_cpu_variants as _load_cpu_variants

__version__ = "0.1.0"

# A llama.cpp built with GGML_BACKEND_DL registers its CPU variants before any model loads
# (robot_latency.llama_backends); any other build: nothing happens, nothing is imported.
_load_cpu_variants()
