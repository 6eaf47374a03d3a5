"""What the target's answer is built from, gathered once for every front end.

- :func:`predictor_for`: the step predictor for a model on a device under an engine family, with
  ``predict``'s corrections. ``predict --stream``, the records (``PlannerRun``) and the report all
  build it here, so they predict the same milliseconds from the same inputs.
- :func:`model_preset`: the preset a model is (a preset id, or a ladder file inflated from one),
  for the per-model correction.
- :class:`TargetInputs` and ``target.json`` in a run directory: the untimed pass, the stream's
  commands and replay speed, and the prediction's settings, written beside the timed run (the
  demo does) so the report can simulate the loop on the target from the run directory alone.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from robot_latency.floor.devices import get_device
from robot_latency.floor.modelinfo import resolve_model
from robot_latency.floor.steps import StepPredictor, step_predictor
from robot_latency.floor.target import resolve_calibration
from robot_latency.models.ladder import inflated_preset
from robot_latency.planner.config import RunSettings
from robot_latency.planner.untimed import UntimedError, UntimedPass, run_untimed
from robot_latency.streams import Command, CommandStream

#: The file a run directory keeps the target's inputs in.
TARGET_FILE = "target.json"


def model_preset(model: str | None) -> str | None:
    """Return the preset id ``model`` is: itself for a preset id, the source preset of a ladder
    file inflated from one (``planner-inflated-qwen2.5-0.5b.Q8_0.gguf``), else None."""
    if model is None:
        return None
    inflated = inflated_preset(Path(model).name)
    if inflated is not None:
        preset = inflated[1]
        return preset.rsplit(".", 1)[0] if Path(model).suffix == ".gguf" else preset
    return None if Path(model).exists() else model


def predictor_for(model: str, device_id: str, engine_family: str, *, quant: str | None = None,
                  calibration: str | None = None) -> StepPredictor:
    """Return the step predictor of ``model`` (a GGUF path or a preset id) on ``device_id``.

    Memoized per process by the file's size and modification time: reading a GGUF's metadata
    parses its whole vocabulary (about a minute for a 151,936-token one on a loaded 2-core
    host), and the report asks once for the comparison and once for its text.

    Raises:
        FloorError: an unknown device, model or family, or a family the table cannot calibrate.
    """
    stat = Path(model).stat() if Path(model).is_file() else None
    return _predictor_for(model, device_id, engine_family, quant, calibration,
                          None if stat is None else (stat.st_size, stat.st_mtime_ns))


@lru_cache(maxsize=32)
def _predictor_for(model: str, device_id: str, engine_family: str, quant: str | None,
                   calibration: str | None, _version: tuple[int, int] | None) -> StepPredictor:
    device = get_device(device_id)
    facts = resolve_model(model, quant=None if Path(model).is_file() else quant)
    cal = resolve_calibration(engine_family, device, calibration=calibration or None)
    return step_predictor(facts, device, cal, spec=model, model_id=model_preset(model))


@dataclass(frozen=True)
class TargetInputs:
    """A level's inputs to the target's answer, as kept in a run directory."""

    untimed: UntimedPass
    stream: CommandStream
    speed: float
    model: str
    quant: str | None
    device_id: str
    engine_family: str
    calibration: str | None
    settings: RunSettings  # the loop's rules (its loop fields; the manifest's ``config``)
    #: None: an untimed pass of the model; else what the pass assumes (built from labels: the
    #: model writes each labelled plan), in words, for the answer's text
    assumption: str | None = None

    def predictor(self) -> StepPredictor:
        return predictor_for(self.model, self.device_id, self.engine_family, quant=self.quant,
                             calibration=self.calibration)

    def to_dict(self) -> dict[str, Any]:
        return {"untimed": self.untimed.to_dict(), "speed": self.speed, "model": self.model,
                "quant": self.quant, "device_id": self.device_id,
                "engine_family": self.engine_family, "calibration": self.calibration,
                "loop": self.settings.loop_config(), "assumption": self.assumption,
                "stream": {"name": self.stream.name, "source": self.stream.source,
                           "commands": [[c.t_ns, c.text, c.command_id, c.state]
                                        for c in self.stream.commands]}}


def untimed_cache_dir() -> Path:
    """Where untimed passes are cached by content hash (beside the model cache)."""
    from robot_latency.models.ladder import default_cache_dir

    return default_cache_dir().parent / "untimed"


def untimed_inputs(settings: RunSettings, stream: CommandStream, *, speed: float = 1.0,
                   cache_dir: str | os.PathLike[str] | None = None,
                   use_cache: bool = True) -> TargetInputs:
    """Resolve ``settings``, run (or load from the cache) its untimed pass of ``stream``, and
    return the level's inputs to the target's answer: the one builder ``predict --stream`` and
    the demo use. ``cache_dir`` None: :func:`untimed_cache_dir`; ``use_cache`` False: run the
    pass, read and write no cache.

    Raises:
        SettingsError: settings that cannot be resolved (``name`` is the field).
        UntimedError: the engine failed on a command, or no model to predict.
    """
    from robot_latency.planner.resolve import resolve_run

    run, _ = resolve_run(settings)
    model = run.engine_options.get("model_path") or run.model
    if model is None:
        raise UntimedError(f"engine {settings.engine}: no model to predict")
    where = None if not use_cache else untimed_cache_dir() if cache_dir is None else cache_dir
    untimed = run_untimed(run, stream, cache_dir=where)
    return TargetInputs(untimed=untimed, stream=stream, speed=speed, model=str(model),
                        quant=run.quant, device_id=settings.target_device,
                        engine_family=settings.engine_family or "llamacpp-cuda",
                        calibration=settings.calibration or None,
                        settings=settings)


def labelled_inputs(settings: RunSettings, stream: CommandStream, *, model: str,
                    quant: str | None = None, labels_path: str | os.PathLike[str] | None = None,
                    speed: float = 1.0) -> TargetInputs:
    """Return a level's inputs to the target's answer without the model's weights: the untimed
    pass built from the stream's labels (:mod:`robot_latency.planner.labelled`), tokenized by
    ``model``'s tokenizer (a GGUF file loaded vocabulary-only, or a preset's shipped one).

    Labels: the commands' own (a JSONL stream's ``expected``), then ``labels_path``, else
    ``labels.jsonl`` beside the stream (in a bag directory, or beside a file).

    Raises:
        UntimedError: no labels, or no labelled command; a label that cannot be read.
        VocabError: no tokenizer for ``model``.
        ProfileError: the profile cannot be loaded.
    """
    from robot_latency.planner.labelled import labelled_pass
    from robot_latency.profiles.labels import LabelError, read_labels, stream_labels
    from robot_latency.profiles.profile import load_planning
    from robot_latency.profiles.vocab import tokenizer_for_model

    planning, template_words = _preset_template(load_planning(settings.profile), model)
    schema = _labels_schema(planning)
    src = Path(stream.source)
    if labels_path is None:
        beside = (src if src.is_dir() else src.parent) / "labels.jsonl"
        labels_path = beside if beside.is_file() else None
    try:
        sidecar = read_labels(labels_path, schema=schema) if labels_path is not None else None
        labels = stream_labels(stream.commands, schema=schema, source=stream.source,
                               sidecar=sidecar)
    except LabelError as err:
        raise UntimedError(str(err)) from err
    if not len(labels):
        raise UntimedError(f"{stream.source}: no labels (a labels.jsonl beside it, --labels, or "
                           "each JSONL line's \"expected\"): without weights, the answer "
                           "assumes the model writes each labelled plan")
    with tokenizer_for_model(model) as tok:
        lp = labelled_pass(planning, stream, labels, tok,
                           max_tokens=settings.max_tokens or planning.max_tokens,
                           max_command_chars=settings.max_command_chars,
                           grammar=settings.grammar, warm_prefix=bool(planning.prefix),
                           model=model)
    words = (f"assumes the model writes each command's labelled plan (no weights, no untimed "
             f"pass): {lp.output_format}, tokenized by {Path(lp.tokenizer).name}"
             f"{template_words}")
    if lp.unlabelled:
        words += (f"; {len(lp.unlabelled)} of {len(stream.commands)} commands have no label and "
                  "are left out (their arrivals dropped)")
    if lp.unwritable:
        words += (f"; {len(lp.unwritable)} labels this format cannot write are left out the "
                  "same way")
    if lp.off_contract:
        words += (f"; {lp.off_contract} labelled plans break the profile's contract (simulated "
                  "at their length, no valid plan)")
    return TargetInputs(untimed=lp.untimed, stream=lp.stream, speed=speed, model=str(model),
                        quant=quant, device_id=settings.target_device,
                        engine_family=settings.engine_family or "llamacpp-cuda",
                        calibration=settings.calibration or None, settings=settings,
                        assumption=words)


def _preset_template(planning: Any, model: str) -> tuple[Any, str]:
    """``planning`` prompted in a model preset's own chat template, and the words that say so.

    An instruct model is prompted in its own template, whatever template a profile names for
    another family: a preset (not a GGUF file) whose shipped tokenizer family has one
    (:func:`robot_latency.profiles.vocab.preset_chat_format`) gets it in place of the profile's
    named template. A ``raw`` profile is left as it is (it prompts with no template at all).
    """
    from dataclasses import replace as with_field

    from robot_latency.profiles.chat import RAW
    from robot_latency.profiles.profile import Planning
    from robot_latency.profiles.vocab import preset_chat_format

    own = None if Path(model).is_file() else preset_chat_format(model)
    named = planning.profile.chat_format
    if named == RAW:
        return planning, ", no chat template (the profile's raw prompt)"
    if own is None or named == own:
        return planning, f", chat template {named}"
    return (Planning(with_field(planning.profile, chat_format=own)),
            f", chat template {own} ({model}'s own; profile {planning.profile.name} names "
            f"{named})")


def _labels_schema(planning: Any) -> dict[str, Any]:
    """The schema labels are read against: the profile's, or the action language's (the
    shipped streams' labels are in it, and may hold more steps than a JSON profile allows)."""
    from robot_latency.profiles.actions import plan_json_schema
    from robot_latency.profiles.labels import label_schema

    own, actions = label_schema(planning.contract), plan_json_schema()
    if own == actions:
        return own
    strip = ("$schema", "$id")
    return {"anyOf": [{k: v for k, v in s.items() if k not in strip} for s in (own, actions)]}


def write_target_inputs(inputs: TargetInputs, run_dir: str | os.PathLike[str]) -> Path:
    """Write ``target.json`` into ``run_dir``."""
    path = Path(run_dir) / TARGET_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(inputs.to_dict(), indent=1) + "\n", encoding="utf-8")
    return path


def _loop_settings(loop: dict[str, Any], path: Path) -> RunSettings:
    from robot_latency.planner.config import LOOP_FIELDS, SettingsError

    values = {k: tuple(v) if isinstance(v, list) else v for k, v in loop.items()
              if k in LOOP_FIELDS}
    try:
        return RunSettings(**values)
    except SettingsError as err:
        raise UntimedError(f"{path}: loop.{err.name}: {err.message}") from err


def read_target_inputs(run_dir: str | os.PathLike[str]) -> TargetInputs | None:
    """Read ``target.json`` of a run directory; None where there is none.

    Raises:
        UntimedError: the file is there but broken (names the file and the field).
    """
    path = Path(run_dir) / TARGET_FILE
    if not path.is_file():
        return None
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
        s = d["stream"]
        stream = CommandStream(name=str(s["name"]), source=str(s["source"]), topic=None,
                               commands=tuple(Command(int(t), str(text), str(cid), state)
                                              for t, text, cid, state in s["commands"]))
        return TargetInputs(
            untimed=UntimedPass.from_dict(d["untimed"], where=str(path)), stream=stream,
            speed=float(d["speed"]), model=str(d["model"]), quant=d.get("quant"),
            device_id=str(d["device_id"]), engine_family=str(d["engine_family"]),
            calibration=d.get("calibration"), settings=_loop_settings(d["loop"], path),
            assumption=d.get("assumption"))
    except UntimedError:
        raise
    except KeyError as err:
        raise UntimedError(f"{path}: missing field {err.args[0]!r}") from err
    except (OSError, json.JSONDecodeError, TypeError, ValueError) as err:
        raise UntimedError(f"{path}: cannot read the target's inputs: {err!r}") from err
