"""The bandwidth-floor model: device profiles, model profiles and latency predictions."""
