"""The bundled planner refuses what it cannot plan: on the shipped labelled streams, at least 90%
of the commands labelled "refuse" and at most 2% of the in-domain ones (llama.cpp, grammar on)."""

from __future__ import annotations

import llama_cpp

from robot_latency.models import bundled
from robot_latency.models.evaluate import GGUFPlanner
from robot_latency.profiles.actions import (
    actions_gbnf,
    expand_to_plan,
    is_refusal,
    parse_actions,
    plan_json_schema,
)
from robot_latency.profiles.labels import default_labels_path, read_labels
from robot_latency.streams import SHIPPED_DIR, SHIPPED_STREAMS, read_stream


def test_the_bundled_planner_refuses_off_vocabulary_commands_only() -> None:
    grammar = llama_cpp.LlamaGrammar.from_string(actions_gbnf(), verbose=False)
    refuse = refused = domain = domain_refused = correct = 0
    with GGUFPlanner(bundled.bundled_model_path()) as planner:
        for spec in SHIPPED_STREAMS:
            bag = SHIPPED_DIR / spec.name
            labels = read_labels(default_labels_path(bag), schema=plan_json_schema())
            for cmd in read_stream(bag).commands:
                label = labels.lookup(None, cmd.text)
                plan = expand_to_plan(parse_actions(planner.complete(cmd.text, grammar=grammar)))
                correct += bool(label.judge(plan))
                if label.refuse:
                    refuse += 1
                    refused += is_refusal(plan)
                else:
                    domain += 1
                    domain_refused += is_refusal(plan)
    assert refuse >= 20 and domain >= 90
    assert refused / refuse >= 0.9, (refused, refuse)
    assert domain_refused / domain <= 0.02, (domain_refused, domain)
    assert correct / (refuse + domain) >= 0.85  # the plans themselves, untimed
