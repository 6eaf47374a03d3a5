"""robot_latency: an edge-robot control-loop latency testbed for language-model planners."""

__version__ = "0.1.0"
