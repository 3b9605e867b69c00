"""synth-ai RL and SFT TOML configs: lenient aliases, typed validation, synth's cross-field rules.

`load_rl(raw)` / `load_sft(raw)` turn a parsed TOML dict into (model, warnings) or raise ConfigError with one
Problem per mistake (field path = dotted TOML key path). `normalized_config(model)` is the snake_case dict
the trainer reads (unknown keys kept, aliases resolved, `smoke` dropped).

Lenient aliases (configs people already have): `[policy].model` = `model_name`, `[verifier]` = `[judge]`,
`verifier_url` = `judge_url`, top-level `[topology]` = `[compute.topology]`, `[lora]` = `[training.lora]`,
`[job].data_path` = `data`, SFT `variety = "qlora"` = lora + use_qlora, `lora_*` keys under
`[hyperparameters]` = `[training.lora]`, eval keys nested in `[hyperparameters.parallelism]` lifted out,
an incomplete `[judge.options]` = no judge (warning)."""

from __future__ import annotations

import copy
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator

from posttrain.api import model_ids, settings, topology
from posttrain.api.base import Section
from posttrain.api.inert import RL_INERT, SFT_INERT, inert_warnings
from posttrain.api.judge_settings import JudgeSettings
from posttrain.api.rollout_settings import STEP_REWARD_STRATEGIES
from posttrain.api.sections import (
    JUDGE_PROVIDERS,
    AlgorithmConfig,
    ComputeConfig,
    EvaluationConfig,
    HyperparametersConfig,
    JudgeConfig,
    ModelSection,
    PolicySection,
    ReferenceConfig,
    RLTrainingConfig,
    RolloutConfig,
    RubricConfig,
    ServicesConfig,
    SFTDataSection,
    SFTJobSection,
    SFTTrainingConfig,
    VllmConfig,
)
from posttrain.api.settings import rl_settings_class
from posttrain.errors import Problem

EXACTLY_ONE_MODEL = "Config must set exactly one of [model].source or [model].base"
EXACTLY_ONE_POLICY = "Must set exactly one: [policy].model_name OR [policy].source"
RL_ALGORITHM = ("online", "policy_gradient", "gspo")
# ReST-EM (Singh et al. 2023): synth has no spelling for it; posttrain reads `variety = "restem"` (method
# defaults to "restem"). It runs as an RLJob: the same rollout server and task app, SFT updates.
RESTEM_ALGORITHM = ("online", "restem", "restem")
# every RL variety posttrain runs, (type, method, variety), from posttrain.api.settings.RL_ALGORITHMS
RL_ALGORITHMS = tuple(("online", model.method, variety) for variety, model in settings.RL_ALGORITHMS.items())
SFT_ALGORITHMS = {
    ("offline", "sft", "fft"),
    ("offline", "supervised_finetune", "fft"),
    ("offline", "sft", "lora"),
}
DEPRECATED_JUDGE_OPTIONS = ("max_concurrency", "tracks")


class ConfigError(Exception):
    """One or more problems with a config; `problems` carry field paths (file/line added by the caller)."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


def _tags(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): v if isinstance(v, str) else str(v).lower() if isinstance(v, bool) else str(v)
                for k, v in value.items()}  # fmt: skip
    return value


class RLConfig(Section):
    """A synth RL TOML ([algorithm], [model], [rollout], [training], ...), after the lenient aliases are resolved."""

    algorithm: AlgorithmConfig = Field(description="(online, policy_gradient, gspo).")
    services: ServicesConfig | None = Field(None, description="Task app and judge URLs.")
    compute: ComputeConfig = Field(description="GPUs and their split between roles.")
    vllm: VllmConfig | None = Field(None, description="Rollout inference server.")
    reference: ReferenceConfig | None = Field(None, description="KL reference model server.")
    model: ModelSection | None = Field(None, description="Starting weights: exactly one of base / source.")
    policy: PolicySection | None = Field(None, description="Policy model and sampling defaults.")
    rollout: RolloutConfig = Field(description="Episode collection.")
    evaluation: EvaluationConfig | None = Field(None, description="Periodic evaluation.")
    training: RLTrainingConfig | None = Field(None, description="GSPO training.")
    rubric: RubricConfig | None = Field(None, description="Deprecated reward blending.")
    judge: JudgeConfig | None = Field(None, description="LLM judges ([verifier] is an alias).")
    tags: dict[str, str] | None = Field(None, description="Metadata.")

    @field_validator("tags", mode="before")
    @classmethod
    def _tags_as_strings(cls, value: Any) -> Any:
        return _tags(value)


class SFTConfig(Section):
    """A synth SFT TOML ([job], [model], [data], [training], ...), after the lenient aliases are resolved."""

    algorithm: AlgorithmConfig = Field(description="(offline, sft, fft|lora).")
    job: SFTJobSection = Field(description="Base model and training data.")
    compute: ComputeConfig | None = Field(None, description="GPUs.")
    data: SFTDataSection | None = Field(None, description="Data topology and validation file.")
    training: SFTTrainingConfig | None = Field(None, description="Training mode, QLoRA, validation, LoRA.")
    hyperparameters: HyperparametersConfig = Field(
        default_factory=HyperparametersConfig, description="Optimizer and batch settings."
    )
    policy: PolicySection | None = Field(None, description="Not used by SFT; kept.")
    tags: dict[str, str] | None = Field(None, description="Metadata.")

    @field_validator("tags", mode="before")
    @classmethod
    def _tags_as_strings(cls, value: Any) -> Any:
        return _tags(value)


# ------------------------------------------------------------------------------------------ type


def infer_type(raw: dict[str, Any]) -> Literal["rl", "sft", "eval", "filter"] | None:
    """synth's config_finder._infer_config_type, plus: an [algorithm] type offline / a [job].model = SFT;
    a file with an [eval] or [filter] table and no [algorithm] is synth's eval or filter config."""
    algo = raw.get("algorithm") if isinstance(raw.get("algorithm"), dict) else {}
    for table in ("eval", "filter"):
        if isinstance(raw.get(table), dict) and not algo:
            return table  # type: ignore[return-value]
    method = str(algo.get("method") or "").lower()
    if method in ("policy_gradient", "ppo", "reinforce") or str(algo.get("type") or "").lower() == "online":
        return "rl"
    if str(algo.get("variety") or "").lower() in ("grpo", "ppo", *settings.RL_ALGORITHMS):
        return "rl"
    if str(raw.get("job_type") or "").lower() == "rl":
        return "rl"
    services = raw.get("services")
    if isinstance(services, dict) and ("task_url" in services or "environment" in services):
        return "rl"
    if str(raw.get("job_type") or "").lower() == "sft":
        return "sft"
    if str(algo.get("type") or "").lower() == "offline" or method in ("sft", "supervised_finetune"):
        return "sft"
    if isinstance(raw.get("job"), dict) and "model" in raw["job"]:
        return "sft"
    if isinstance(raw.get("hyperparameters"), dict):
        return "sft"
    if isinstance(raw.get("rollout"), dict):
        return "rl"
    return None


# ------------------------------------------------------------------------------------------ helpers


def _merge(low: Any, high: Any) -> Any:
    """Merge two TOML tables; `high` wins key by key."""
    if isinstance(low, dict) and isinstance(high, dict):
        out = dict(low)
        for key, value in high.items():
            out[key] = _merge(out.get(key), value) if key in out else value
        return out
    return high if high is not None else low


def _table(raw: dict[str, Any], key: str) -> dict[str, Any] | None:
    value = raw.get(key)
    return value if isinstance(value, dict) else None


# pydantic error type -> what to write instead ({ctx} keys are filled in)
_FIXES: dict[str, str] = {
    "less_than_equal": "use a value <= {le}",
    "less_than": "use a value < {lt}",
    "greater_than_equal": "use a value >= {ge}",
    "greater_than": "use a value > {gt}",
    "finite_number": "use a finite number (not inf or nan)",
    "int_parsing": "write a whole number, e.g. 4",
    "int_type": "write a whole number, e.g. 4",
    "int_from_float": "write a whole number (no fraction)",
    "float_parsing": "write a number, e.g. 0.5",
    "float_type": "write a number, e.g. 0.5",
    "bool_parsing": "write true or false",
    "bool_type": "write true or false",
    "string_type": 'write a quoted string, e.g. "text"',
    "dict_type": "write a table: a [section] or {{key = value}}",
    "model_type": "write a table: a [section] or {{key = value}}",
    "list_type": "write an array, e.g. [1, 2]",
    "too_long": "use at most {max_length} items",
    "string_too_long": "use at most {max_length} characters",
    "too_short": "use at least {min_length} items",
    "literal_error": "use one of the listed values",
    "url_parsing": "write an http(s) URL, e.g. http://host:8000",
}


def fix_for(item: dict[str, Any]) -> str | None:
    """The `(fix: ...)` for one pydantic error item."""
    template = _FIXES.get(item.get("type", ""))
    if template is None:
        return None
    try:
        return template.format(**(item.get("ctx") or {}))
    except (KeyError, IndexError):
        return None


def _problems_from(err: ValidationError, prefix: str = "") -> list[Problem]:
    problems = []
    for item in err.errors():
        loc = ".".join(str(p) for p in item["loc"] if not isinstance(p, int))
        field = f"{prefix}{loc}" if loc else prefix.rstrip(".") or None
        message = item["msg"]
        if item["type"] == "value_error":
            message = message.removeprefix("Value error, ").split(" -- fix: ", 1)[0]
        fix = fix_for(item)
        if item["type"] == "missing":
            message = "required field is missing"
            fix = (
                f"add {loc.rsplit('.', 1)[-1]} = ... to [{loc.rsplit('.', 1)[0]}]"
                if "." in loc
                else f"add [{loc}]"
            )
        elif "input" in item and item["type"] != "value_error" and not isinstance(item["input"], dict | list):
            message += f" (got {item['input']!r})"[:120]
        problems.append(Problem(message, field=field, fix=fix or _value_error_fix(item)))
    return problems


def _value_error_fix(item: dict[str, Any]) -> str | None:
    """A validator's ValueError carries its fix after ' -- fix: ' (see sections.py)."""
    error = (item.get("ctx") or {}).get("error")
    text = str(error) if error is not None else ""
    return text.split(" -- fix: ", 1)[1] if " -- fix: " in text else None


def _aliases_common(raw: dict[str, Any], warnings: list[str]) -> dict[str, Any]:
    raw = copy.deepcopy(raw)
    raw.pop("smoke", None)  # CLI-only in synth; stripped before submission
    # [policy].model -> model_name
    policy = _table(raw, "policy")
    if policy is not None and "model" in policy and "model_name" not in policy:
        policy["model_name"] = policy.pop("model")
    # [lora] -> [training.lora]
    if "lora" in raw and isinstance(raw["lora"], dict):
        training = raw.setdefault("training", {})
        if isinstance(training, dict):
            training["lora"] = _merge(raw.pop("lora"), training.get("lora"))
    return raw


def _model_from_policy(raw: dict[str, Any]) -> None:
    """[policy] only: its model_name/source/trainer_mode/label become [model] (synth's 0.2.19 builder only
    reads [model]; [policy] is the "preferred" spelling, so both are accepted)."""
    policy = _table(raw, "policy")
    if policy is None or "model" in raw:
        return
    model: dict[str, Any] = {}
    if policy.get("model_name") is not None:
        model["base"] = policy.pop("model_name")
    if policy.get("source") is not None:
        model["source"] = policy.pop("source")
    for key in ("trainer_mode", "label"):
        if key in policy:
            model[key] = policy.pop(key)
    if model:
        raw["model"] = model


def _check_exactly_one(raw: dict[str, Any], problems: list[Problem]) -> None:
    model = _table(raw, "model")
    policy = _table(raw, "policy")
    if model is not None and bool(model.get("source")) == bool(model.get("base")):
        both = "both are set" if model.get("source") else "neither is set"
        problems.append(
            Problem(
                f"{EXACTLY_ONE_MODEL} ({both})",
                field="model.source, model.base",
                fix="keep model.base for a base model or model.source for a fine-tuned id, not both",
            )
        )
    if policy is not None and policy.get("model_name") and policy.get("source"):
        problems.append(
            Problem(
                EXACTLY_ONE_POLICY,
                field="policy.model_name, policy.source",
                fix="keep one of them",
            )
        )
    if model is None and policy is not None and not policy.get("model_name") and not policy.get("source"):
        problems.append(
            Problem(
                EXACTLY_ONE_POLICY + " (neither is set)",
                field="policy.model_name, policy.source",
                fix="set [policy].model_name (a base model) or [policy].source (a fine-tuned id)",
            )
        )
    if model is None and policy is None:
        problems.append(
            Problem(
                f"{EXACTLY_ONE_MODEL} (there is no [model] or [policy] section)",
                field="model.source, model.base",
                fix='add [model] with base = "Qwen/Qwen3-4B" (or source = an earlier job\'s fine-tuned id)',
            )
        )


def _check_model_ids(model: ModelSection, mode: str, problems: list[Problem], field: str = "model") -> None:
    try:
        if model.base:
            model.base = model_ids.normalize_base(model.base, mode)
        if model.source:
            model.source = model_ids.normalize_source(model.source, mode)
    except model_ids.ModelIdError as err:
        which = "base" if model.base and not model.source else "source"
        problems.append(
            Problem(str(err), field=f"{field}.{which}", fix=err.fix or "use a supported model id")
        )


def base_model_of(model: ModelSection) -> str | None:
    """The base model id of a [model] section (the base of a fine-tuned source)."""
    if model.base:
        return model.base
    if model.source and model_ids.is_fine_tuned_id(model.source):
        try:
            return model_ids.base_of_fine_tuned(model.source)
        except model_ids.ModelIdError:
            return None
    return None


def _vision_autofill(model: ModelSection) -> None:
    """synth's helper: Qwen3-VL models load the vision processor, one image per message by default (also
    posttrain's own tiny Qwen2-VL)."""
    base = base_model_of(model)
    known = model_ids.lookup(base) if base else None
    if not base or not ("qwen3-vl-" in base.lower() or (known is not None and known.vision)):
        return
    if model.supports_vision is None:
        model.supports_vision = True
    if model.vision_processor_id is None:
        model.vision_processor_id = base
    if model.max_images_per_message is None:
        model.max_images_per_message = 1


# ------------------------------------------------------------------------------------------ RL


def load_rl(raw: dict[str, Any]) -> tuple[RLConfig, list[str]]:
    """Validate an RL TOML dict; returns (config, warnings) or raises ConfigError."""
    warnings: list[str] = []
    problems: list[Problem] = []
    raw = _aliases_common(raw, warnings)
    # [verifier] -> [judge], verifier_url -> judge_url
    if "verifier" in raw:
        raw["judge"] = _merge(raw.pop("verifier"), raw.get("judge"))
    services = _table(raw, "services")
    if services is not None and "verifier_url" in services:
        url = services.pop("verifier_url")
        services.setdefault("judge_url", url)
    # top-level [topology] -> [compute.topology]
    if isinstance(raw.get("topology"), dict):
        compute = raw.setdefault("compute", {})
        if isinstance(compute, dict):
            compute["topology"] = _merge(raw.pop("topology"), compute.get("topology"))
    _check_exactly_one(raw, problems)
    _model_from_policy(raw)
    # algorithm: synth's validator and builder
    algo = _table(raw, "algorithm")
    if algo is None:
        problems.append(Problem("[algorithm] is required", field="algorithm",
                                fix='add [algorithm] type = "online", method = "policy_gradient", variety = "gspo"'))  # fmt: skip
    else:
        known = settings.RL_ALGORITHMS.get(str(algo.get("variety") or "").lower())
        algo.setdefault("type", "online")
        algo.setdefault("method", known.method if known is not None else "policy_gradient")
        if algo.get("method") == "gspo":
            algo["method"] = "policy_gradient"
        got = (algo.get("type"), algo.get("method"), algo.get("variety"))
        if got not in RL_ALGORITHMS:
            problems.append(
                Problem(
                    f"unsupported RL algorithm (type, method, variety) = {got}; posttrain runs "
                    + ", ".join(m.title for m in list(settings.RL_ALGORITHMS.values())[:-1])
                    + f" and {list(settings.RL_ALGORITHMS.values())[-1].title}",
                    field="algorithm",
                    fix='use type = "online", method = "policy_gradient", variety = "gspo" (or variety = '
                    + ", ".join(f'"{v}" for {m.title}' for v, m in settings.RL_ALGORITHMS.items() if v != "gspo")
                    + ")",
                )
            )
    compute = _table(raw, "compute")
    if compute is not None and not compute.get("topology"):
        problems.append(
            Problem(
                "[compute.topology] (or top-level [topology]) is required and must not be empty",
                field="compute.topology",
                fix="add [compute.topology] with gpus_for_vllm, gpus_for_training and gpus_for_ref",
            )
        )
    model = _table(raw, "model")
    if model is not None:
        for key in ("trainer_mode", "label"):
            if not model.get(key):
                problems.append(Problem("required field is missing", field=f"model.{key}",
                                        fix=f"add {key} = ... to [model] (or [policy])"))  # fmt: skip
    # judge: timeout_s migrates into options; deprecated option keys are stripped
    judge = _table(raw, "judge")
    if judge is not None:
        options = judge.get("options") if isinstance(judge.get("options"), dict) else None
        if options is not None:
            if "timeout_s" in judge and "timeout_s" not in options:
                options["timeout_s"] = judge["timeout_s"]
            for key in DEPRECATED_JUDGE_OPTIONS:
                if key in options:
                    options.pop(key)
                    warnings.append(f"judge.options.{key} is deprecated and ignored")
    if problems:
        raise ConfigError(problems)
    try:
        config = RLConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_problems_from(err)) from err
    inert = inert_warnings(config, RL_INERT)  # the keys the user wrote, not those the rules fill in
    _rl_rules(config, problems, warnings)
    if problems:
        raise ConfigError(problems)
    return config, warnings + inert


def is_restem(config: RLConfig) -> bool:
    return (config.algorithm.type, config.algorithm.method, config.algorithm.variety) == RESTEM_ALGORITHM


def _rl_rules(config: RLConfig, problems: list[Problem], warnings: list[str]) -> None:
    assert config.model is not None
    training = config.training
    if is_restem(config):
        topo = config.compute.topology
        if (topo and topo.gpus_for_ref) or (config.reference and config.reference.placement == "dedicated"):
            warnings.append("ReST-EM uses no reference model: the reference GPUs stay unused")
    elif training is not None and rl_settings_class({"algorithm": {"variety": config.algorithm.variety}}).needs_groups:
        problems += [Problem(m, field=f, fix=x) for f, m, x in settings.group_problems(training.group_size)]
    _check_model_ids(config.model, "rl", problems)
    _vision_autofill(config.model)
    problems += topology.split_problems(config.compute)
    config.reference = topology.settle_reference_placement(config.compute, config.reference)
    problems += topology.dedicated_reference_problems(config.compute)
    problems += topology.tensor_parallel_problems(config.compute, config.vllm)
    pc = config.rollout.policy_config
    if pc is not None and pc.image_only_mode and pc.use_vision is False:
        problems.append(Problem("image_only_mode implies use_vision", field="rollout.policy_config.use_vision",
                                fix="remove use_vision = false or image_only_mode = true"))  # fmt: skip
    if config.rollout.image_only_mode and config.rollout.use_vision is False:
        problems.append(Problem("image_only_mode implies use_vision", field="rollout.use_vision",
                                fix="remove use_vision = false or image_only_mode = true"))  # fmt: skip
    wants_vision = bool(
        (pc and (pc.use_vision or pc.image_only_mode))
        or config.rollout.use_vision
        or config.rollout.image_only_mode
    )
    if wants_vision and not config.model.supports_vision:
        warnings.append("rollout asks for vision but the model does not support it (model.supports_vision)")
    _rl_fsdp_rules(config, problems, warnings)
    _async_rules(config, problems, warnings)
    _judge_rules(config, problems, warnings)
    _step_reward_rules(config, problems)




def _step_reward_rules(config: RLConfig, problems: list[Problem]) -> None:
    """step_rewards_strategy names a strategy the trainer knows (posttrain_trainer.step_rewards), flat or
    nested."""
    training = config.training
    if training is None:
        return
    for where, section in (("training", training), ("training.rewards", training.rewards)):
        value = getattr(section, "step_rewards_strategy", None) if section is not None else None
        if value is not None and str(value).strip().lower() not in STEP_REWARD_STRATEGIES:
            problems.append(Problem(f"unknown step-reward strategy {value!r}", field=f"{where}.step_rewards_strategy",
                                    fix='use "consistent" (or "simple") or "per_achievement" (or "complex")'))  # fmt: skip


def _async_rules(config: RLConfig, problems: list[Problem], warnings: list[str]) -> None:
    """training.async_depth: GSPO's asynchronous sampling (settings.async_problems); ReST-EM ignores it."""
    training = config.training
    if training is None or not training.async_depth:
        return
    if is_restem(config):
        warnings.append("training.async_depth: ReST-EM samples, then trains; async_depth is ignored")
        return
    interval = training.weight_sync_interval or getattr(training.weight_sync, "weight_sync_interval", None)
    problems += [Problem(m, field=f, fix=x)
                 for f, m, x in settings.async_problems(training.async_depth, training.old_logprobs, interval)]  # fmt: skip


def _rl_fsdp_rules(config: RLConfig, problems: list[Problem], warnings: list[str]) -> None:
    """training.parallelism.fsdp (FSDP2) shards GSPO's full fine-tuning; it is one sharding or the other."""
    parallelism = config.training.parallelism if config.training else None
    if parallelism is None or not parallelism.fsdp:
        return
    if is_restem(config):
        warnings.append("training.parallelism.fsdp: ReST-EM trains under DDP or DeepSpeed; fsdp is ignored")
        return
    mode = config.model.trainer_mode if config.model else None
    problems += [Problem(m, field=f, fix=x)
                 for f, m, x in settings.fsdp_problems(True, bool(parallelism.use_deepspeed), mode)]  # fmt: skip


def _judge_rules(config: RLConfig, problems: list[Problem], warnings: list[str]) -> None:
    judge = config.judge
    rubric = config.rubric
    if rubric is not None and rubric.weights is not None:
        w = rubric.weights
        if not (w.env or w.event or w.outcome):
            problems.append(Problem("rubric weights are all zero", field="rubric.weights",
                                    fix="give env, event or outcome a positive weight"))  # fmt: skip
    if rubric is not None and rubric.enabled and judge is None:
        warnings.append("rubric.enabled = true without [judge]: rubric scoring is disabled")
    if judge is None:
        return
    options = judge.options
    if options is None or not options.provider or not options.model:
        if judge.enabled is not False:
            warnings.append(
                "[judge.options] lacks provider and model: no judge will score rollouts "
                "(synth's CLI rejects this; add provider and model to use a judge)"
            )
        return
    if options.provider.lower() not in JUDGE_PROVIDERS:
        problems.append(
            Problem(
                f"unknown judge provider {options.provider!r}",
                field="judge.options.provider",
                fix=f"use one of {', '.join(JUDGE_PROVIDERS)}",
            )
        )
    if options.event is False and options.outcome is False:
        problems.append(Problem("judge.options: event and outcome are both false", field="judge.options",
                                fix="set event = true or outcome = true"))  # fmt: skip
    for field, message, fix in judge.cluster_problems():
        if field == "api_key_secret_ref":  # a local run takes the key from this machine's environment
            warnings.append(f"{message}: posttrain convert refuses it without [judge.api_key_secret_ref]")
        else:
            problems.append(Problem(message, field=f"judge.{field}", fix=fix))
    if (options.model_extra or {}).get("api_key_env"):
        warnings.append("judge.options.api_key_env is read only by `posttrain train --local`; a cluster job's "
                        "judge key comes from the Secret [judge.api_key_secret_ref] names")  # fmt: skip
    try:
        resolved: JudgeSettings | None = JudgeSettings.from_sections(judge, rubric, calls_judges=not is_restem(config))
    except ValueError:  # a negative blend weight: the rule below names it
        resolved = None
    if resolved is not None and resolved.idle:  # configured, never called: nothing reads it, nothing is deployed
        warnings.append(f"[judge] {options.provider}/{options.model} does nothing: {resolved.idle_reason}; no judge "
                        "is called and none is deployed")  # fmt: skip
    if resolved is not None and resolved.unknown_weights:
        warnings.append(f"{resolved.weights_from}: {', '.join(resolved.unknown_weights)} blend nothing (the "
                        "names are env, event and outcome)")  # fmt: skip
    blend = judge.reward_blend or {}
    if any(v < 0 for v in blend.values()):
        problems.append(Problem("reward_blend weights must be >= 0", field="judge.reward_blend",
                                fix="use non-negative weights"))  # fmt: skip
    elif blend and not any(blend.values()):
        problems.append(Problem("reward_blend weights are all zero", field="judge.reward_blend",
                                fix="give at least one weight a positive value"))  # fmt: skip


# ------------------------------------------------------------------------------------------ SFT

_LORA_HYPERPARAMS = {"lora_rank": "r", "lora_r": "r", "lora_alpha": "alpha", "lora_dropout": "dropout",
                     "lora_target_modules": "target_modules"}  # fmt: skip
_EVAL_KEYS = ("evaluation_strategy", "eval_steps", "save_best_model_at_end", "metric_for_best_model",
              "greater_is_better")  # fmt: skip


def load_sft(raw: dict[str, Any]) -> tuple[SFTConfig, list[str]]:
    """Validate an SFT TOML dict; returns (config, warnings) or raises ConfigError."""
    warnings: list[str] = []
    problems: list[Problem] = []
    raw = _aliases_common(raw, warnings)
    job = _table(raw, "job")
    if job is not None and "data_path" in job and "data" not in job:
        job["data"] = job.pop("data_path")
    hp = _table(raw, "hyperparameters")
    if hp is not None:
        lora = {new: hp.pop(old) for old, new in _LORA_HYPERPARAMS.items() if old in hp}
        if lora:
            training = raw.setdefault("training", {})
            training["lora"] = _merge(lora, training.get("lora"))
            warnings.append("lora_* keys under [hyperparameters] were read as [training.lora]")
        par = hp.get("parallelism")
        if isinstance(par, dict):
            for key in _EVAL_KEYS:
                if key in par and key not in hp:
                    hp[key] = par.pop(key)
    algo = _table(raw, "algorithm")
    if algo is None:
        problems.append(Problem("[algorithm] is required", field="algorithm",
                                fix='add [algorithm] type = "offline", method = "sft", variety = "fft" or "lora"'))  # fmt: skip
    else:
        if algo.get("variety") == "qlora":
            algo["variety"] = "lora"
            training = raw.setdefault("training", {})
            if training.get("use_qlora") is False:  # would be read as plain LoRA: say so instead
                problems.append(Problem('variety = "qlora" but training.use_qlora = false', field="training.use_qlora",
                                        fix='drop use_qlora (variety = "qlora" means it), or write variety = "lora"'))  # fmt: skip
            training.setdefault("use_qlora", True)
            warnings.append('variety = "qlora" read as variety = "lora" with training.use_qlora = true')
        got = (algo.get("type"), algo.get("method"), algo.get("variety"))
        if got not in SFT_ALGORITHMS:
            problems.append(
                Problem(
                    f"unsupported SFT algorithm (type, method, variety) = {got}",
                    field="algorithm",
                    fix='use type = "offline", method = "sft", variety = "fft" or "lora"',
                )
            )
    if job is None or not job.get("model"):
        problems.append(Problem("required field is missing", field="job.model",
                                fix='add [job] model = "Qwen/Qwen3-4B"'))  # fmt: skip
    if problems:
        raise ConfigError(problems)
    try:
        config = SFTConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_problems_from(err)) from err
    _sft_rules(config, problems, warnings)
    if problems:
        raise ConfigError(problems)
    warnings += inert_warnings(config, SFT_INERT)
    return config, warnings


def sft_trainer_mode(config: SFTConfig) -> str:
    """full, lora or qlora: posttrain.api.settings.trainer_mode, the one derivation."""
    return settings.trainer_mode(normalized_config(config))


def _sft_rules(config: SFTConfig, problems: list[Problem], warnings: list[str]) -> None:
    model_id = config.job.model or ""
    try:
        if model_ids.is_fine_tuned_id(model_id):
            config.job.model = model_ids.normalize_source(model_id, "sft")
        else:
            config.job.model = model_ids.normalize_base(model_id, "sft")
    except model_ids.ModelIdError as err:
        problems.append(Problem(str(err), field="job.model", fix=err.fix or "use a supported model id"))
    hp = config.hyperparameters
    if not any((v or 0) > 0 for v in (hp.n_epochs, hp.total_steps, hp.train_steps, hp.steps)):
        problems.append(Problem("no training length", field="hyperparameters.n_epochs",
                                fix="set n_epochs, total_steps, train_steps or steps > 0"))  # fmt: skip
    variety = config.algorithm.variety
    use_qlora = bool(config.training and config.training.use_qlora)
    if variety == "fft" and use_qlora:
        problems.append(Problem("use_qlora needs LoRA training but variety = \"fft\"", field="training.use_qlora",
                                fix='set variety = "lora" or use_qlora = false'))  # fmt: skip
    if hp.train_kind is not None and (hp.train_kind == "fft") != (variety == "fft"):
        problems.append(
            Problem(
                f'train_kind = "{hp.train_kind}" contradicts variety = "{variety}"',
                field="hyperparameters.train_kind",
                fix='use train_kind = "fft" with variety "fft" and "peft" with "lora"',
            )
        )
    if hp.parallelism is not None and hp.parallelism.fsdp:
        warnings.append("hyperparameters.parallelism.fsdp: FSDP shards RL full fine-tuning only; this SFT job "
                        "trains under DDP (or DeepSpeed ZeRO with use_deepspeed = true)")  # fmt: skip
    mode = config.training.mode if config.training else None
    if mode == "full_finetune" and variety != "fft" or mode == "lora" and variety == "fft":
        problems.append(Problem(f'training.mode = "{mode}" contradicts variety = "{variety}"', field="training.mode",
                                fix="make training.mode and algorithm.variety agree"))  # fmt: skip
    if config.compute is not None and config.compute.topology is not None:
        topo = config.compute.topology
        if config.compute.nodes and topo.gpus_for_training and topo.gpus_for_training % config.compute.nodes:
            problems.append(Problem("compute.nodes does not divide gpus_for_training", field="compute.nodes",
                                    fix="use a node count that divides the trainer GPUs"))  # fmt: skip
    compute = config.compute
    if (
        compute is not None
        and compute.nodes
        and compute.topology is None
        and compute.gpu_count % compute.nodes
    ):
        problems.append(
            Problem(
                f"compute.nodes = {config.compute.nodes} does not divide gpu_count = {config.compute.gpu_count}",
                field="compute.nodes",
                fix="use a node count that divides gpu_count",
            )
        )


# ------------------------------------------------------------------------------------------ output


def normalized_config(config: RLConfig | SFTConfig) -> dict[str, Any]:
    """The snake_case synth config dict the trainer reads (unknown keys inline, None dropped)."""
    return config.model_dump(exclude_none=True, by_alias=False)


def load_config(raw: dict[str, Any], kind: str) -> tuple[RLConfig | SFTConfig, list[str]]:
    if kind == "rl":
        return load_rl(raw)
    if kind == "sft":
        return load_sft(raw)
    raise ValueError(f"kind must be rl or sft, not {kind!r}")
