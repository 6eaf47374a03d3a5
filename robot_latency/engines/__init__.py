"""Engines behind one protocol (:mod:`robot_latency.engines.base`), registered by name.

Importing this package registers the engines whose dependencies are importable.
"""

from robot_latency.engines import (  # noqa: F401  (register the engines)
    llamacpp,
    onnx,
    openai_server,
    sim,
)
from robot_latency.engines.base import (
    ENGINES,
    Engine,
    EngineError,
    GenerationRequest,
    GenerationTrace,
    StopReason,
    UnknownEngineError,
    create_engine,
)

__all__ = ["ENGINES", "Engine", "EngineError", "GenerationRequest", "GenerationTrace",
           "StopReason", "UnknownEngineError", "create_engine"]
