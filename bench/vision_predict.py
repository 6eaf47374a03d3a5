"""The image's cost predicted, checked against this host and answered for the Jetsons.

The host check: the towers' measured encode and image prefill (``--measured``, a
``vision_cost.py`` JSON) against the vision prediction (robot_latency.floor.vision) on the
"host" datasheet, whose compute figure is the probe's sustained matmul rate (all cores; the
measured JSON's thread count should match). No prefill calibration of this host ships, so the
compute efficiency is the floor layer's default for an uncalibrated prefill
(``--compute-efficiency`` overrides it); the JSON gives, per tower, predicted / measured and the
efficiency that would have matched. Then each tower is predicted on ``--devices`` under
``--engine-family`` (the published tables' calibration) for the same language model.

    cd bench && python vision_predict.py --out ../docs/bench/vision_predict.json
    python bench/vision_predict.py --smoke --out /tmp/vision_predict.json
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

from benchio import emit_result

from robot_latency.floor.calibration import DEFAULT_COMPUTE_EFFICIENCY, Calibration
from robot_latency.floor.devices import DeviceSheet, get_device
from robot_latency.floor.modelinfo import resolve_model
from robot_latency.floor.probe import load_or_probe_host
from robot_latency.floor.target import resolve_calibration
from robot_latency.floor.vision import predict_vision
from robot_latency.floor.vision_tower import VisionTower
from robot_latency.models.mmproj import tower_shape

log = logging.getLogger("vision_predict")
HERE = Path(__file__).resolve().parent
DEFAULT_MEASURED = HERE.parent / "docs" / "bench" / "vision_cost_2threads.json"
#: The language model's shape where the measured file's GGUF is not on this machine.
FALLBACK_LM = ("qwen2.5-0.5b", "Q4_K_M")


def floor_tower(name: str, projection_dim: int, image_px: int | None = None) -> VisionTower:
    """The floor layer's view of a shape the project writes (robot_latency.models.mmproj)."""
    s = tower_shape(name)
    return VisionTower(name=s.name, projector=s.projector,
                       image_size_px=image_px or s.image_size_px, patch_px=s.patch_px,
                       width=s.width, ffn=s.ffn, layers=s.layers, projection_dim=projection_dim,
                       scale_factor=s.scale_factor, class_token=s.class_token)


def host_calibration(efficiency: float) -> Calibration:
    """The host's prefill terms: ``efficiency`` of the probe's rate, no overhead (uncalibrated
    unless given)."""
    return Calibration(engine_family="llamacpp-cpu", device_id="host", scope="device",
                       efficiency=1.0, overhead_ms=0.0, overhead_fixed=True,
                       interval_rel=(0.0, 0.0), compute_efficiency=efficiency,
                       prefill_overhead_ms=0.0,
                       prefill_calibrated=efficiency != DEFAULT_COMPUTE_EFFICIENCY,
                       source="host probe", basis=())


def host_check(measured: dict[str, Any], host: DeviceSheet, lm: Any,
               efficiency: float) -> dict[str, Any]:
    cal = host_calibration(efficiency)
    frame = tuple(measured["frame_px"])
    out: dict[str, Any] = {}
    for name, got in measured["towers"].items():
        tower = floor_tower(name, int(measured["lm"]["n_embd"]), got["image_size_px"])
        p = predict_vision(tower, lm, host, cal, frame_px=frame)  # type: ignore[arg-type]
        enc, pre = got["median"]["encode_ms"], got["median"]["image_prefill_ms"]
        out[name] = {
            "image_tokens_predicted": p.image_tokens, "image_tokens_measured": got["image_tokens"],
            "encode_gflop": p.encode_gflop,
            "encode_ms_predicted": p.encode_ms, "encode_ms_measured": enc,
            "encode_ratio": p.encode_ms / enc,
            "image_prefill_ms_predicted": p.image_prefill_ms, "image_prefill_ms_measured": pre,
            "image_prefill_ratio": p.image_prefill_ms / pre,
            "encode_efficiency_matching": efficiency * p.encode_ms / enc,
            "image_prefill_efficiency_matching": efficiency * p.image_prefill_ms / pre,
            "encode_gflops_measured": p.encode_gflop / (enc / 1e3)}
    return out


def _shown(path: Path) -> str:
    """``path`` relative to the repository where it is inside it."""
    try:
        return str(path.resolve().relative_to(HERE.parent))
    except ValueError:
        return str(path)


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    ap.add_argument("--measured", type=Path, default=DEFAULT_MEASURED,
                    help="a vision_cost.py JSON (default: the 2-thread figures in docs/bench)")
    ap.add_argument("--compute-efficiency", type=float, default=DEFAULT_COMPUTE_EFFICIENCY,
                    help="the host's prefill compute efficiency (default: uncalibrated)")
    ap.add_argument("--devices", default="orin-nano-8gb,orin-nano-8gb-super,orin-agx-64gb")
    ap.add_argument("--engine-family", default="llamacpp-cuda")
    ap.add_argument("--prompt-tokens", type=int, default=300,
                    help="the text prompt beside the frame")
    ap.add_argument("--smoke", action="store_true", help="one device")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if not 0 < args.compute_efficiency <= 1:
        ap.error("--compute-efficiency must be in (0, 1]")
    measured = json.loads(args.measured.read_text())
    lm_path = Path(measured["lm"]["path"])
    lm = (resolve_model(str(lm_path)) if lm_path.is_file()
          else resolve_model(FALLBACK_LM[0], quant=FALLBACK_LM[1]))
    host = load_or_probe_host()
    devices = args.devices.split(",")[:1] if args.smoke else args.devices.split(",")
    targets: dict[str, Any] = {}
    for dev_id in devices:
        dev = get_device(dev_id)
        cal = resolve_calibration(args.engine_family, dev)
        targets[dev_id] = {}
        for name in measured["towers"]:
            p = predict_vision(floor_tower(name, int(measured["lm"]["n_embd"])), lm, dev, cal,
                               frame_px=tuple(measured["frame_px"]),  # type: ignore[arg-type]
                               prompt_tokens=args.prompt_tokens)
            targets[dev_id][name] = p.to_dict()
    return emit_result({
        "measured": _shown(args.measured), "measured_threads": measured["threads"],
        "lm": {"path": str(lm_path), "on_this_machine": lm_path.is_file(), "name": lm.name},
        "host": {"matmul_gflops": host.fp16_tflops * 1e3 if host.fp16_tflops else None,
                 "compute_efficiency": args.compute_efficiency,
                 "calibrated": args.compute_efficiency != DEFAULT_COMPUTE_EFFICIENCY,
                 "cpu_cores": host.cpu_cores},
        "host_check": host_check(measured, host, lm, args.compute_efficiency),
        "engine_family": args.engine_family, "prompt_tokens": args.prompt_tokens,
        "targets": targets}, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
