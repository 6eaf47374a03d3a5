"""The deadline-enforced planner: the cycle loop, fallback policies, prompts. No ROS inside."""
