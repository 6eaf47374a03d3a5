"""The plain and the managed planner node pass the same topic and parameter checks.

Both nodes run in-process over real rclpy and Fast DDS, side by side in their own namespaces
(sim engine, event mode, a planner profile whose prompt carries ``{state}``); the managed one is
configured and activated through its lifecycle services. An outside client node then asks both
the same questions through the ROS graph and the parameter services, and each answer must be the
same for both (and what the tables say): so the two nodes cannot drift apart again.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import rclpy
import yaml
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from lifecycle_msgs.msg import Transition
from lifecycle_msgs.srv import ChangeState
from rcl_interfaces.srv import DescribeParameters, GetParameters, ListParameters, SetParameters
from rclpy.context import Context
from rclpy.lifecycle import LifecycleState
from rclpy.node import Node, NodeNameNonExistentError
from rclpy.parameter import Parameter
from rclpy.qos import QoSProfile, ReliabilityPolicy
from std_msgs.msg import String

from robot_latency.engines.llama_server import free_port
from robot_latency.ros.declare import descriptor
from robot_latency.ros.managed_planner_node import ManagedPlannerNode
from robot_latency.ros.params import PLANNER_PARAMS
from robot_latency.ros.planner_node import PlannerNode
from robot_latency.ros.topics import (
    COMMAND_TOPIC,
    CYCLE_JSON_ENDPOINTS,
    CYCLE_TOPIC,
    PLAN_ACTION,
    PLAN_ACTION_TYPE,
    PLAN_JSON_ENDPOINTS,
    PLANNER_ENDPOINTS,
    PROBE_ENDPOINTS,
    STATE_TOPIC,
)

DOMAIN_ID = random.randint(1, 232)
Spinner = Any  # test/ros/conftest.py's Spinner, handed out by the spinner_for fixture
KINDS = ("plain", "managed")
#: What a lifecycle node has of its own, beside the planner's endpoints.
LIFECYCLE_ONLY = {("pub", "~/transition_event", "lifecycle_msgs/msg/TransitionEvent")}
STATUSES = {"deadline", "latency", "engine", "mailbox"}


class Nodes:
    """The two planner nodes under test and the outside client that questions them."""

    def __init__(self, spin: Spinner, tmp: Path) -> None:
        self.spin = spin
        self.wait_for = spin.wait_for
        self.client = spin.add(Node("parity_client", context=spin.executor.context))
        #: one service client per (type, service), kept: destroyed with the node, not while
        #: the executor spins (see test/ros/conftest.py)
        self.service_clients: dict[tuple[Any, str], Any] = {}
        self.lock = threading.Lock()
        #: (node name, status name) -> (level, message) of the newest such status
        self.diagnostics: dict[tuple[str, str], tuple[int, str]] = {}
        self.client.create_subscription(DiagnosticArray, "/diagnostics", self._on_diag, 100)
        profile = tmp / "stateful.yaml"
        profile.write_text(yaml.safe_dump({
            "name": "stateful", "normalize": "bundled", "chat_format": "raw",
            "prompt": {"user": "{state} {command}<plan>", "state_default": "idle"},
            "output": {"contract": "actions", "max_tokens": 24}}))
        tag = f"{random.randrange(16**6):06x}"
        self.ns = {kind: f"/parity_{kind}_{tag}" for kind in KINDS}
        self.name = {kind: f"{kind}_planner" for kind in KINDS}
        self.log_dir = {kind: tmp / f"{kind}-run" for kind in KINDS}

        def overrides(kind: str) -> list[Parameter]:
            return [Parameter("engine", value="sim"),
                    Parameter("target_device", value="orin-agx-64gb"),
                    Parameter("mode", value="event"), Parameter("deadline_ms", value=5000.0),
                    Parameter("period_ms", value=5000.0),
                    Parameter("planner_profile", value=str(profile)),
                    Parameter("log_dir", value=str(self.log_dir[kind])),
                    Parameter("diagnostics_period_s", value=0.2)]

        self.overrides = overrides
        self.nodes: dict[str, Any] = {}

    def start(self) -> None:
        """Start the plain node; configure and activate the managed one."""
        context = self.spin.executor.context
        plain = PlannerNode(self.name["plain"], namespace=self.ns["plain"], context=context,
                            parameter_overrides=self.overrides("plain"))
        self.nodes["plain"] = self.spin.add(plain)
        assert plain.startup_error is None, plain.startup_error
        assert plain.start()
        managed = ManagedPlannerNode(self.name["managed"], namespace=self.ns["managed"],
                                     context=context,
                                     parameter_overrides=self.overrides("managed"))
        self.nodes["managed"] = self.spin.add(managed)
        assert self.transition(Transition.TRANSITION_CONFIGURE), managed.last_error
        assert self.transition(Transition.TRANSITION_ACTIVATE), managed.last_error

    def _on_diag(self, msg: DiagnosticArray) -> None:
        with self.lock:
            for s in msg.status:
                node, _, status = s.name.partition(": ")
                self.diagnostics[(node, status)] = (s.level[0], s.message)

    def status(self, node: str, status: str) -> tuple[int, str] | None:
        with self.lock:
            return self.diagnostics.get((node, status))

    def fqn(self, kind: str) -> str:
        return f"{self.ns[kind]}/{self.name[kind]}"

    def call(self, srv_type: Any, service: str, request: Any) -> Any:
        client = self.service_clients.get((srv_type, service))
        if client is None:
            client = self.client.create_client(srv_type, service)
            self.service_clients[(srv_type, service)] = client
        assert client.wait_for_service(timeout_sec=30), f"no service {service}"
        future = client.call_async(request)
        self.spin.wait_for(future.done, 60, f"an answer from {service}")
        return future.result()

    def transition(self, transition_id: int, node: str = "") -> bool:
        """Ask the managed node (or the node of that full name) for a lifecycle transition."""
        request = ChangeState.Request()
        request.transition.id = transition_id
        return bool(self.call(ChangeState, f"{node or self.fqn('managed')}/change_state",
                              request).success)

    def endpoints(self, kind: str) -> set[tuple[str, str, str]]:
        """Return (pub|sub, topic, type) of the node, its namespace and name made relative."""
        ns, name = self.ns[kind], self.name[kind]

        def relative(topic: str) -> str:
            if topic.startswith(f"{ns}/{name}/"):
                return "~/" + topic[len(f"{ns}/{name}/"):]
            return topic[len(ns) + 1:] if topic.startswith(f"{ns}/") else topic

        graph = {"pub": self.client.get_publisher_names_and_types_by_node(name, ns),
                 "sub": self.client.get_subscriber_names_and_types_by_node(name, ns)}
        return {(direction, relative(topic), t) for direction, found in graph.items()
                for topic, types in found for t in types}

    def action_servers(self, kind: str) -> set[tuple[str, str]]:
        """Return (action, type) of the action servers the node serves, names made relative."""
        from rclpy.action import get_action_server_names_and_types_by_node

        ns, name = self.ns[kind], self.name[kind]
        found = get_action_server_names_and_types_by_node(self.client, name, ns)
        return {(a[len(ns) + 1:] if a.startswith(f"{ns}/") else a, t)
                for a, types in found for t in types}

    def close(self) -> dict[str, dict[str, Any]]:
        summaries = {"plain": self.nodes["plain"].close()}
        assert self.transition(Transition.TRANSITION_DEACTIVATE)
        summaries["managed"] = self.nodes["managed"].summaries[-1]
        assert self.transition(Transition.TRANSITION_CLEANUP)
        return summaries


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory,
          spinner_for: Callable[[Context], Spinner]) -> Iterator[Nodes]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
        mp.setenv("ROS_LOCALHOST_ONLY", "1")
        context = Context()
        rclpy.init(context=context, domain_id=DOMAIN_ID)
        spin = spinner_for(context)
        built = Nodes(spin, tmp_path_factory.mktemp("parity"))
        try:
            built.start()
            yield built
            summaries = built.close()
            for kind in KINDS:  # both close their run the same way: the summary has every cycle
                lines = (built.log_dir[kind] / "cycles.jsonl").read_text().splitlines()
                assert summaries[kind]["cycles"] == len(lines), kind
        finally:
            spin.stop()  # before on_shutdown destroys the managed node's topics
            if "plain" in built.nodes:
                built.nodes["plain"].close()  # no-op once closed
            if "managed" in built.nodes:
                built.nodes["managed"].on_shutdown(LifecycleState(0, "test"))  # as main() does
            spin.close()
            context.try_shutdown()


def test_same_parameters_with_the_same_descriptors(nodes: Nodes) -> None:
    declared: dict[str, dict[str, Any]] = {}
    for kind in KINDS:
        names = nodes.call(ListParameters, f"{nodes.fqn(kind)}/list_parameters",
                           ListParameters.Request()).result.names
        described = nodes.call(DescribeParameters, f"{nodes.fqn(kind)}/describe_parameters",
                               DescribeParameters.Request(names=list(names))).descriptors
        declared[kind] = dict(zip(names, described, strict=True))
    assert set(declared["plain"]) == set(declared["managed"])
    for name, d in declared["plain"].items():
        assert d == declared["managed"][name], name
    for spec in PLANNER_PARAMS:  # and both as the table says (rclpy fills in the type)
        got, want = declared["plain"][spec.name], descriptor(spec)
        want.type = got.type
        assert got == want, spec.name


def test_both_serve_the_plan_action(nodes: Nodes) -> None:
    expected = {(PLAN_ACTION, PLAN_ACTION_TYPE)}
    found = {kind: nodes.wait_for(lambda k=kind: (lambda got: got if expected <= got else None)(
        nodes.action_servers(k)), 30, f"the {kind} node's action server") for kind in KINDS}
    assert found["plain"] == found["managed"] == expected


def test_same_topics_with_the_same_types(nodes: Nodes) -> None:
    expected = {(e.direction, e.topic, e.type)
                for e in (*PLANNER_ENDPOINTS, *PLAN_JSON_ENDPOINTS, *CYCLE_JSON_ENDPOINTS,
                          *PROBE_ENDPOINTS)}

    def discovered(kind: str) -> set[tuple[str, str, str]] | None:
        try:
            got = nodes.endpoints(kind)
        except NodeNameNonExistentError:  # not in the graph yet
            return None
        return got if expected <= got else None
    found = {kind: nodes.wait_for(lambda k=kind: discovered(k), 30, f"the {kind} node's topics")
             for kind in KINDS}
    assert found["plain"] == found["managed"] - LIFECYCLE_ONLY, (
        found["plain"] ^ (found["managed"] - LIFECYCLE_ONLY))


def test_the_state_topic_reaches_the_prompt_on_both(nodes: Nodes) -> None:
    qos = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE)
    for kind in KINDS:
        ns = nodes.ns[kind]
        prompts: list[str] = []
        nodes.client.create_subscription(
            String, f"{ns}/{CYCLE_TOPIC}",
            lambda msg, got=prompts: got.append(json.loads(msg.data).get("prompt")), qos)
        command = nodes.client.create_publisher(String, f"{ns}/{COMMAND_TOPIC}", qos)
        state = nodes.client.create_publisher(
            String, f"{ns}/{STATE_TOPIC}", QoSProfile(depth=1,
                                                      reliability=ReliabilityPolicy.RELIABLE))
        nodes.wait_for(lambda c=command, s=state: c.get_subscription_count() >= 1
                 and s.get_subscription_count() >= 1, 30, f"the {kind} node's subscriptions")
        state.publish(String(data=f"docked-{kind}"))

        # The state is taken at the next cycle: resend until a prompt shows it (delivery of the
        # state message is asynchronous).
        def saw_state(c: Any = command, got: list[str] = prompts, k: str = kind) -> bool:
            c.publish(String(data="stop"))
            time.sleep(0.1)
            return f"docked-{k} stop<plan>" in list(got)
        nodes.wait_for(saw_state, 60, f"a prompt on the {kind} node carrying the published state")


def test_runtime_parameter_updates_are_judged_the_same(nodes: Nodes) -> None:
    updates = [("deadline_ms", 50.0, False),          # fixed at start-up
               ("miss_rate_warn", 2.0, False),        # out of range
               ("miss_rate_warn", 0.5, False),        # above miss_rate_error (0.05)
               ("diagnostics_window", "many", False),  # not a number
               ("miss_rate_warn", 0.02, True),
               ("diagnostics_period_s", 0.3, True)]   # the diagnostics timer restarts
    answers: dict[str, list[tuple[bool, str]]] = {}
    for kind in KINDS:
        answers[kind] = []
        for name, value, _ in updates:
            request = SetParameters.Request(
                parameters=[Parameter(name, value=value).to_parameter_msg()])
            result = nodes.call(SetParameters, f"{nodes.fqn(kind)}/set_parameters",
                                request).results[0]
            answers[kind].append((result.successful, result.reason))
    assert answers["plain"] == answers["managed"]
    assert [ok for ok, _ in answers["plain"]] == [ok for _, _, ok in updates], answers["plain"]
    for (name, _, ok), (_, reason) in zip(updates, answers["plain"], strict=True):
        assert ok or name in reason, (name, reason)
    assert "cannot change at run time" in answers["plain"][0][1]
    for kind in KINDS:
        got = nodes.call(GetParameters, f"{nodes.fqn(kind)}/get_parameters",
                         GetParameters.Request(names=["miss_rate_warn", "deadline_ms"])).values
        assert (got[0].double_value, got[1].double_value) == (0.02, 5000.0), kind


def test_both_report_the_same_health_on_diagnostics(nodes: Nodes) -> None:
    def statuses(kind: str) -> set[str]:
        with nodes.lock:
            return {status for node, status in nodes.diagnostics if node == nodes.name[kind]}
    for kind in KINDS:
        nodes.wait_for(lambda k=kind: statuses(k) >= STATUSES, 30, f"the {kind} node's health")
    assert statuses("plain") == statuses("managed")


def test_the_managed_node_takes_any_parameter_until_configured(
        nodes: Nodes, tmp_path: Path) -> None:
    """Unconfigured, every parameter may change (configure reads them); a bad kind or range is
    refused at once, as the plain node refuses it."""
    node = ManagedPlannerNode("unconfigured_planner", namespace=nodes.ns["managed"],
                              context=nodes.client.context,
                              parameter_overrides=[Parameter("log_dir", value=str(tmp_path))])
    try:
        assert node.set_parameters([Parameter("deadline_ms", value=120.0)])[0].successful
        refused = node.set_parameters([Parameter("mode", value="sometimes")])[0]
        assert not refused.successful and "mode" in refused.reason
        refused = node.set_parameters([Parameter("max_tokens", value="lots")])[0]
        assert not refused.successful and "max_tokens" in refused.reason
        assert node.get_parameter("deadline_ms").value == 120.0
        assert node.settings is None and node.driver is None  # nothing built before configure
    finally:
        node.destroy_node()  # never spun: no executor thread holds it


def test_both_report_an_offboard_server_that_does_not_answer(
        nodes: Nodes, tmp_path: Path, spinner_for: Callable[[Context], Spinner]) -> None:
    """Engine openai with no server at its address: each node comes up (the managed one
    configures and activates) and reports the engine as ERROR on /diagnostics, naming it."""
    url = f"http://127.0.0.1:{free_port()}/v1"
    for kind in KINDS:
        name = f"{kind}_offboard"
        params = [Parameter("engine", value="openai"), Parameter("server_url", value=url),
                  Parameter("period_ms", value=1000.0), Parameter("deadline_ms", value=900.0),
                  Parameter("log_dir", value=str(tmp_path / kind)),
                  Parameter("diagnostics_period_s", value=0.2)]
        node_type = PlannerNode if kind == "plain" else ManagedPlannerNode
        ns = f"{nodes.ns[kind]}_offboard"  # apart from the nodes above: no shared topics
        # Spun apart from the module's nodes, so that it can be destroyed when the test ends.
        spin = spinner_for(nodes.client.context)
        node = spin.add(node_type(name, namespace=ns, context=nodes.client.context,
                                  parameter_overrides=params))
        try:
            if kind == "plain":
                assert node.startup_error is None and node.start(), node.startup_error
            else:
                fqn = f"{ns}/{name}"
                assert nodes.transition(Transition.TRANSITION_CONFIGURE, fqn), node.last_error
                assert nodes.transition(Transition.TRANSITION_ACTIVATE, fqn), node.last_error
            level, message = nodes.wait_for(lambda n=name: nodes.status(n, "engine"), 60,
                                            f"the {kind} node's engine status")
            assert level == DiagnosticStatus.ERROR[0] and "127.0.0.1" in message, (kind, message)
        finally:
            spin.stop()  # before on_shutdown destroys the node's topics
            if kind == "plain":
                node.close()
            else:
                node.on_shutdown(LifecycleState(0, "test"))
            spin.close()
