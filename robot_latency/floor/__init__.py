"""The bandwidth-floor model: device datasheets, model facts and latency predictions."""

# Registers the "host" and "auto" resolvers of floor.devices.get_device (see device_lookup).
from robot_latency.floor import device_lookup as device_lookup
