"""The planner node most people would write without this project (the benchmark's baseline).

rclpy and llama-cpp-python's ``create_completion``, called in the subscription callback for
each command, on the same model, grammar and prompt as ``planner_node`` (the planner profile
builds the prompt and parses the output), greedy: no deadline, no fallback, no worker process,
the default ``KEEP_LAST(10)`` queue. It answers on the same topics in the same JSON envelope
(planner/plan_json), so the same client-edge replayer measures it. It accepts the replayer's
tagged commands (the only concession: the id the plan must carry back to be matched).

Its best settings are parameters: ``n_threads`` (decode), ``n_threads_batch`` (prefill; 0:
llama-cpp-python's default), ``grammar`` (constrained decoding or not).

    python bench/naive_node.py --ros-args -p model:=/path/to/planner.Q4_0.gguf -p n_threads:=1
"""

from __future__ import annotations

import json
import sys

import llama_cpp
import rclpy
from rclpy.executors import ExternalShutdownException
from rclpy.node import Node
from std_msgs.msg import String

from robot_latency.llama_load import load_policy, open_llama
from robot_latency.profiles.actions import PlanParseError
from robot_latency.profiles.profile import load_planning
from robot_latency.ros.client_edge import untag_command
from robot_latency.ros.topics import COMMAND_TOPIC, PLAN_JSON_TOPIC


class NaivePlanner(Node):
    """Subscribe, generate, publish: one command at a time, as long as it takes."""

    def __init__(self) -> None:
        super().__init__("planner_node")
        model = self.declare_parameter("model", "").value
        n_threads = self.declare_parameter("n_threads", 1).value
        n_threads_batch = self.declare_parameter("n_threads_batch", 0).value
        use_grammar = self.declare_parameter("grammar", True).value
        profile = self.declare_parameter("planner_profile", "").value
        self.planning = load_planning(profile or None)
        self.max_tokens = self.declare_parameter("max_tokens", 0).value \
            or self.planning.max_tokens
        self.llm = open_llama(load_policy(), model_path=model, n_ctx=0, n_threads=n_threads,
                              n_threads_batch=n_threads_batch or None, verbose=False)
        gbnf = self.planning.contract.grammar if use_grammar else None
        self.grammar = (llama_cpp.LlamaGrammar.from_string(gbnf, verbose=False)
                        if gbnf else None)
        # the JSON envelope, where planner_node publishes it too (the replayer reads it there
        # with plan_json:=true); the typed Plan is planner_node's own
        self.pub = self.create_publisher(String, PLAN_JSON_TOPIC, 10)
        self.sub = self.create_subscription(String, COMMAND_TOPIC, self.on_command, 10)
        self.cycle = 0
        self.get_logger().info(f"naive planner ready: {model}")

    def on_command(self, msg: String) -> None:
        command_id, text = untag_command(msg.data)
        out = self.llm.create_completion(self.planning.build(text).text,
                                         max_tokens=self.max_tokens, temperature=0.0,
                                         grammar=self.grammar,
                                         stop=list(self.planning.stop) or None)
        raw = out["choices"][0]["text"]
        try:
            plan = self.planning.contract.parse(raw)
        except PlanParseError:
            plan = None
        self.pub.publish(String(data=json.dumps(
            {"cycle": self.cycle, "command_id": command_id, "source": "model", "plan": plan})))
        self.cycle += 1


def main() -> int:
    rclpy.init(args=sys.argv)
    node = NaivePlanner()
    try:
        rclpy.spin(node)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        node.destroy_node()
        rclpy.try_shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
