"""llama-cpp-python's OpenAI-compatible server, loaded with this CPU's extra-buffer-type policy.

    python -m robot_latency.engines.llama_serve [--extra_bufts auto|on|off] ARGS...

ARGS are ``python -m llama_cpp.server``'s own. The server builds its ``Llama`` itself, and
``Llama(...)`` does not expose ``use_extra_bufts``, so this runs that server's ``main`` with the
model parameters set as :func:`robot_latency.llama_load.load_policy` chooses: off where the loaded
llama.cpp has AMX kernels, whose path segfaults in decode (ggml-org/llama.cpp#20824), on elsewhere.
:class:`~robot_latency.engines.llama_server.LocalServer` starts the server this way.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from robot_latency.llama_load import EXTRA_BUFTS_CHOICES, load_policy, model_params_set

log = logging.getLogger(__name__)


def main(argv: Sequence[str] | None = None) -> None:
    """Run llama-cpp-python's server with the load policy applied to every model it loads."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--extra_bufts", choices=EXTRA_BUFTS_CHOICES, default="auto")
    ours, rest = parser.parse_known_args(sys.argv[1:] if argv is None else list(argv))
    policy = load_policy(ours.extra_bufts)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    log.info("%s", policy.reason)
    from llama_cpp.server.__main__ import main as server_main

    sys.argv = [sys.argv[0], *rest]
    with model_params_set(use_extra_bufts=policy.use_extra_bufts):
        server_main()


if __name__ == "__main__":
    main()
